"""One federated client as an OS process: `python -m rankwise.training.federated.worker JOB_DIR PARTITION ADDRESS`.

Reads the job folder written by `federated_flower.run_processes` (job.json: the model builder, the job's settings
and plan, the partitions; data.safetensors: the examples), rebuilds the model with the builder, keeps only its own
partition's examples and serves them to the Flower server at ADDRESS with `flwr.client.start_client` (gRPC).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import torch


def main(argv: list[str]) -> int:
    folder, partition, address = Path(argv[0]), int(argv[1]), argv[2]
    torch.set_num_threads(1)  # one process per client on a small machine: one thread each
    from flwr.client import start_client
    from safetensors.torch import load_file

    from rankwise.training.federated.config import ClientPlan
    from rankwise.training.federated.flower import PrivateClient, config_from_dict, quiet_flower

    quiet_flower()
    spec = json.loads((folder / "job.json").read_text())
    module_name, _, attr = spec["builder"].partition(":")
    model = getattr(importlib.import_module(module_name), attr)(**spec["kwargs"])
    idx = torch.tensor(spec["partitions"][partition], dtype=torch.long)
    data = {k: v[idx] for k, v in load_file(str(folder / "data.safetensors")).items()}
    client = PrivateClient(model, data, partition, config_from_dict(spec["config"]), ClientPlan(**spec["plan"]["clients"][partition]))
    start_client(server_address=address, client=client.to_client(), insecure=True, max_retries=100, max_wait_time=120)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
