"""The federated engine of the harness (Flower): differentially private federated LoRA jobs, and the runner of
training procedures that run as such a job (`Procedure.runs_on == "federated"`).

  config.py     FederatedConfig, the privacy plan (per-client noise from a target epsilon), FederatedModel
  job.py        run_federated: check, plan, then run the rounds on Flower
  flower.py     the Flower client and strategy; in-process or one OS process per client
  worker.py     a client process (`python -m rankwise.training.federated.worker`)
  models.py     vmap-safe classifier logits, and the builder a client process rebuilds its model with
  partition.py  Dirichlet (label-skew) and IID splits of a training set into clients
  driver.py     run_procedure: what `rankwise finetune --procedure la-lora` runs instead of the loop
"""

from rankwise.training.federated.config import FederatedConfig, FederatedModel, FederatedResult, plan
from rankwise.training.federated.driver import run_procedure
from rankwise.training.federated.job import run_federated
from rankwise.training.federated.partition import dirichlet_partition, iid_partition

__all__ = ["FederatedConfig", "FederatedModel", "FederatedResult", "plan", "run_procedure", "run_federated",
           "dirichlet_partition", "iid_partition"]
