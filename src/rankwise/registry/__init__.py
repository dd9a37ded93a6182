"""The catalogue: one record per method card (`records.MethodSpec`), written by family under `families/`, and every
table derived from the records (`tables`). See `records` for what a record holds and how status is computed."""

from rankwise.registry.catalogue import (BY_SLUG, METHODS, all_commands, all_experiments, demo_headlines, folder_loader,
                                         get_method, methods_with_reproduction, parse_target)
from rankwise.registry.general import COMMAND_GROUPS, GENERAL_COMMANDS
from rankwise.registry.readme import README_END, README_START, markdown_table, readme_with_table
from rankwise.registry.records import (FAMILIES, FINETUNE, MAIN, STATUSES, TRAINS, AdapterEntry, BenchmarkEntry,
                                       Command, Experiment, FolderFormat, LayerEntry, MethodSpec, OptimizerEntry,
                                       ProcedureEntry, RunEntry, TaskEntry, marked_test_slugs, report_reproduces, repo_root)
from rankwise.targets import defines, resolve, resolves

__all__ = [
    "BY_SLUG", "METHODS", "all_commands", "all_experiments", "demo_headlines", "folder_loader", "get_method",
    "methods_with_reproduction", "parse_target", "COMMAND_GROUPS", "GENERAL_COMMANDS", "README_END", "README_START",
    "markdown_table", "readme_with_table", "FAMILIES", "FINETUNE", "MAIN", "STATUSES", "TRAINS",
    "AdapterEntry", "BenchmarkEntry", "Command", "Experiment", "FolderFormat", "LayerEntry", "MethodSpec",
    "OptimizerEntry", "ProcedureEntry", "RunEntry", "TaskEntry", "marked_test_slugs", "report_reproduces", "repo_root", "defines",
    "resolve", "resolves",
]
