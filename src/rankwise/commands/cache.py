"""`rankwise cache list` / `rankwise cache clear [--namespace NAME]`: what $RANKWISE_CACHE holds, and emptying it.

Derived entries (calibration statistics) are hash-checked on load and capped at $RANKWISE_CACHE_MAX_BYTES with
least-recently-used eviction; see `rankwise.core.cache`.
"""

from __future__ import annotations

import argparse
import time


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="list or clear rankwise's cache of derived files ($RANKWISE_CACHE)")
    actions = p.add_subparsers(dest="action", required=True, metavar="{list,clear}")
    ls = actions.add_parser("list", help="every cache entry with its size and last use, least recently used first")
    ls.set_defaults(func=run_list)
    clear = actions.add_parser("clear", help="remove cache entries (everything, or one namespace)")
    clear.add_argument("--namespace", default=None, help="only this namespace, e.g. calibration or models (default: all)")
    clear.set_defaults(func=run_clear)


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def run_list(args: argparse.Namespace) -> int:
    from rankwise.core.cache import cache_entries, cache_root, max_cache_bytes

    entries = cache_entries()
    cap = max_cache_bytes()
    print(f"cache: {cache_root()} (derived entries capped at {_size(cap) if cap else 'no limit'}, $RANKWISE_CACHE_MAX_BYTES)")
    if not entries:
        print("the cache is empty")
        return 0
    for e in entries:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used))
        kind = "derived" if e.derived else "kept"
        print(f"  {_size(e.bytes):>10}  {when}  {kind:<7}  {e.namespace}/{e.name}")
    derived = sum(e.bytes for e in entries if e.derived)
    print(f"{len(entries)} entries, {_size(sum(e.bytes for e in entries))} ({_size(derived)} derived, evictable)")
    return 0


def run_clear(args: argparse.Namespace) -> int:
    from rankwise.core.cache import cache_root, clear_cache

    removed = clear_cache(args.namespace)
    where = f"{cache_root()}/{args.namespace}" if args.namespace else str(cache_root())
    print(f"removed {len(removed)} entr{'y' if len(removed) == 1 else 'ies'} ({_size(sum(e.bytes for e in removed))}) from {where}")
    return 0
