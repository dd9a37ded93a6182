"""Domain methods (RL, graphs, vision, embodied control), one sub-package per domain: `apps/<domain>/`."""
