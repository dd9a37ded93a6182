"""Training recipes: procedures that change how a model is trained, beyond an optimizer or a layer (DFA, TraDy, WASI, ...)."""
