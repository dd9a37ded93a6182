"""The Flower side of a federated LA-LoRA job: the client, the server strategy, and the two ways to run them.

- `PrivateClient` (a `flwr.client.NumPyClient`): receives the global tensors, runs one local round (the method's
  `config.local.local_round`) on its examples with its planned noise multiplier, returns the tensors.
  The same class runs in this process and in a `flwr.client.start_client` process (`federated_worker`).
- `PlannedFedAvg` (a `flwr.server.strategy.FedAvg`): samples the round's clients from the plan (a pure function of
  seed and round: Flower's own sampler draws from Python's global RNG, which would make runs irreproducible), finds
  each connected client's partition through its properties, and aggregates A, B and the head by the uniform mean
  over the sampled clients (the paper's FedAvg: `A^t = mean_i A_i`), in float64.
- `run_inprocess`: `flwr.server.Server` with in-process client proxies (`InProcessClientProxy`), one client at a
  time. `run_processes`: `flwr.server.start_server` on 127.0.0.1 and one OS process per client.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.client import NumPyClient
from flwr.common import (DisconnectRes, EvaluateIns, EvaluateRes, FitIns, FitRes, GetParametersIns, GetParametersRes,
                         GetPropertiesIns, GetPropertiesRes, Parameters, ReconnectIns, ndarrays_to_parameters,
                         parameters_to_ndarrays)
from flwr.server import Server, ServerConfig, SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg

from rankwise.errors import InvalidInputError, NumericalError, RankwiseError
from rankwise.training.federated.config import ClientPlan, FederatedConfig, FederatedModel, Plan

CONNECT_TIMEOUT_S = 300.0  # how long the gRPC server waits for every client process to connect


def client_seed(seed: int, partition: int) -> int:
    return seed * 100_003 + partition + 1


class PrivateClient(NumPyClient):
    """One federated client: its examples, its privacy plan, the job's local training settings."""

    def __init__(self, model: FederatedModel, data: Mapping[str, torch.Tensor], partition: int, config: FederatedConfig,
                 client_plan: ClientPlan) -> None:
        self.names, self.roles = list(model.names), dict(model.roles)
        self.loss = model.sample_loss()
        self.data, self.partition, self.config, self.client_plan = dict(data), partition, config, client_plan

    def get_properties(self, config: dict[str, Any]) -> dict[str, Any]:
        return {"partition": self.partition}

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[list[np.ndarray], int, dict[str, Any]]:
        t = int(config["round"])
        params = {n: torch.from_numpy(np.array(a, copy=True)) for n, a in zip(self.names, parameters)}
        new, stats = self.config.local.local_round(self.loss, params, self.roles, self.data, self.client_plan.noise_multiplier,
                                                   t, client_seed(self.config.seed, self.partition))
        bad = [n for n, v in new.items() if not torch.isfinite(v).all()]
        if bad:
            raise NumericalError(f"client {self.partition}, round {t}: {bad[0]} became non-finite; lower the learning rate")
        metrics = {"partition": self.partition, "loss": stats.mean_loss, "clipped_fraction": stats.clipped_fraction,
                   "samples": stats.samples, "A_steps": stats.factor_steps["A"], "B_steps": stats.factor_steps["B"]}
        return [new[n].numpy() for n in self.names], 1, metrics


class PlannedFedAvg(FedAvg):
    """FedAvg over the plan's clients of each round, uniform mean; keeps the latest global tensors and a log."""

    def __init__(self, names: Sequence[str], initial: Mapping[str, torch.Tensor], job: Plan,
                 on_round: Callable[[int, dict[str, float]], None] | None = None) -> None:
        self.names, self.job, self.on_round = list(names), job, on_round
        arrays = [initial[n].detach().cpu().numpy().astype(np.float32) for n in self.names]
        n = len(job.clients)
        super().__init__(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=1, min_evaluate_clients=0,
                         min_available_clients=n, initial_parameters=ndarrays_to_parameters(arrays))
        self.latest = arrays
        self.rounds: list[dict[str, float]] = []
        self._partition_of: dict[str, int] = {}

    def _by_partition(self, client_manager: SimpleClientManager, server_round: int) -> dict[int, ClientProxy]:
        n = len(self.job.clients)
        if not client_manager.wait_for(n, timeout=int(CONNECT_TIMEOUT_S)):
            raise RankwiseError(f"only {client_manager.num_available()} of {n} federated clients connected within "
                                f"{CONNECT_TIMEOUT_S:.0f} s; check the client processes' output")
        out: dict[int, ClientProxy] = {}
        for cid, proxy in client_manager.all().items():
            if cid not in self._partition_of:
                res = proxy.get_properties(GetPropertiesIns(config={}), timeout=CONNECT_TIMEOUT_S, group_id=server_round)
                self._partition_of[cid] = int(res.properties["partition"])
            out[self._partition_of[cid]] = proxy
        missing = sorted(set(range(n)) - set(out))
        if missing:
            raise RankwiseError(f"no connected client holds partition(s) {missing}")
        return out

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: SimpleClientManager) -> list[tuple[ClientProxy, FitIns]]:
        proxies = self._by_partition(client_manager, server_round)
        ins = FitIns(parameters, {"round": server_round})
        return [(proxies[p], ins) for p in self.job.schedule[server_round - 1]]

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures: list[tuple[ClientProxy, FitRes] | BaseException]) -> tuple[Parameters | None, dict[str, Any]]:
        if failures:
            first = failures[0]
            if isinstance(first, BaseException):
                raise first
            raise RankwiseError(f"round {server_round}: a client failed ({first[1].status.message})")
        ordered = sorted(results, key=lambda r: int(r[1].metrics["partition"]))  # a fixed summation order
        arrays = [parameters_to_ndarrays(r.parameters) for _, r in ordered]
        self.latest = [np.mean(np.stack([a[k].astype(np.float64) for a in arrays]), axis=0).astype(np.float32)
                       for k in range(len(self.names))]
        metrics = [r.metrics for _, r in ordered]
        record = {"round": float(server_round), "clients": float(len(metrics)),
                  "loss": float(np.mean([m["loss"] for m in metrics])),
                  "clipped_fraction": float(np.mean([m["clipped_fraction"] for m in metrics])),
                  "A_steps": float(sum(m["A_steps"] for m in metrics)), "B_steps": float(sum(m["B_steps"] for m in metrics))}
        self.rounds.append(record)
        if self.on_round is not None:
            self.on_round(server_round, record)
        return ndarrays_to_parameters(self.latest), {}

    def global_tensors(self) -> dict[str, torch.Tensor]:
        return {n: torch.from_numpy(a.copy()) for n, a in zip(self.names, self.latest)}


class InProcessClientProxy(ClientProxy):
    """A Flower client proxy that calls a `flwr.client.Client` in this process (no transport)."""

    def __init__(self, cid: str, client: Any) -> None:
        super().__init__(cid)
        self.client = client

    def get_properties(self, ins: GetPropertiesIns, timeout: float | None, group_id: int | None) -> GetPropertiesRes:
        return self.client.get_properties(ins)

    def get_parameters(self, ins: GetParametersIns, timeout: float | None, group_id: int | None) -> GetParametersRes:
        return self.client.get_parameters(ins)

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
        return self.client.fit(ins)

    def evaluate(self, ins: EvaluateIns, timeout: float | None, group_id: int | None) -> EvaluateRes:
        return self.client.evaluate(ins)

    def reconnect(self, ins: ReconnectIns, timeout: float | None, group_id: int | None) -> DisconnectRes:
        return DisconnectRes(reason="in-process client")


def quiet_flower() -> None:
    """Flower logs every round and message at INFO; keep its warnings and errors only."""
    logging.getLogger("flwr").setLevel(logging.WARNING)


def run_inprocess(model: FederatedModel, data: Mapping[str, torch.Tensor], partitions: Sequence[torch.Tensor],
                  config: FederatedConfig, job: Plan, on_round=None) -> tuple[dict[str, torch.Tensor], list[dict[str, float]]]:
    """Flower's Server over in-process clients; one client at a time (deterministic, one CPU thread's worth)."""
    quiet_flower()
    strategy = PlannedFedAvg(model.names, model.tensors(), job, on_round)
    manager = SimpleClientManager()
    for i, idx in enumerate(partitions):
        client = PrivateClient(model, {k: v[torch.as_tensor(idx)] for k, v in data.items()}, i, config, job.client(i))
        manager.register(InProcessClientProxy(str(i), client.to_client()))
    server = Server(client_manager=manager, strategy=strategy)
    server.set_max_workers(1)
    server.fit(num_rounds=config.rounds, timeout=None)
    return strategy.global_tensors(), strategy.rounds


def config_to_dict(config: FederatedConfig) -> dict[str, Any]:
    """The job for a client process: its fields, and the class of `local` by name, to rebuild it there."""
    local = type(config.local)
    return {**asdict(config), "local_class": f"{local.__module__}:{local.__qualname__}"}


def config_from_dict(d: Mapping[str, Any]) -> FederatedConfig:
    from rankwise.targets import resolve

    fields = {k: v for k, v in d.items() if k != "local_class"}
    return FederatedConfig(**{**fields, "local": resolve(d["local_class"])(**d["local"])})


def run_processes(model: FederatedModel, data: Mapping[str, torch.Tensor], partitions: Sequence[torch.Tensor],
                  config: FederatedConfig, job: Plan, builder: tuple[str, dict[str, Any]],
                  on_round=None) -> tuple[dict[str, torch.Tensor], list[dict[str, float]]]:
    """`flwr.server.start_server` on a free loopback port, one `start_client` process per client."""
    from flwr.server import start_server
    from safetensors.torch import save_file

    quiet_flower()
    target, kwargs = builder
    if not isinstance(target, str) or ":" not in target:
        raise InvalidInputError(f"builder must be ('module:function', kwargs), got {builder!r}")
    with tempfile.TemporaryDirectory(prefix="rankwise-federated-") as tmp:
        folder = Path(tmp)
        save_file({k: v.contiguous() for k, v in data.items()}, str(folder / "data.safetensors"))
        spec = {"builder": target, "kwargs": kwargs, "config": config_to_dict(config), "plan": job.to_dict(),
                "partitions": [torch.as_tensor(p).tolist() for p in partitions]}
        (folder / "job.json").write_text(json.dumps(spec))
        address = f"127.0.0.1:{_free_port()}"
        procs = [subprocess.Popen([sys.executable, "-m", "rankwise.training.federated.worker", str(folder), str(i), address])
                 for i in range(len(partitions))]
        strategy = PlannedFedAvg(model.names, model.tensors(), job, on_round)
        try:
            start_server(server_address=address, config=ServerConfig(num_rounds=config.rounds), strategy=strategy)
            codes = [p.wait(timeout=120) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(codes):
            raise RankwiseError(f"federated client processes exited with codes {codes}")
    return strategy.global_tensors(), strategy.rounds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

