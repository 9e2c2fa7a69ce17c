"""``python -m cuctx info [--json]``: the backend, the driver and each device.
``python -m cuctx demo [NAME...]``: run the seeds' examples written with cuctx."""

from __future__ import annotations

import argparse
import importlib
import json
import sys

import cuctx
from cuctx.examples import EXAMPLES

_KEY_PROPERTIES = ("multiprocessor_count", "max_threads_per_block", "max_shared_memory_per_block_optin",
                   "l2_cache_size", "clock_rate", "memory_clock_rate", "global_memory_bus_width",
                   "unified_addressing", "concurrent_managed_access")


def describe() -> dict:
    backend = cuctx.backend()
    version = backend.driver.cuDriverGetVersion()[1]
    devices = []
    for device in cuctx.devices():
        free, total = device.mem_info()
        props = device.properties.as_dict()
        devices.append({
            "ordinal": device.ordinal, "name": device.name, "uuid": device.uuid,
            "pci_bus_id": device.pci_bus_id, "compute_capability": str(device.compute_capability),
            "total_memory": total, "free_memory": free,
            "properties": {k: props[k] for k in _KEY_PROPERTIES if k in props},
        })
    return {"backend": backend.name, "reason": backend.reason,
            "driver_version": f"{version // 1000}.{version % 1000 // 10}", "devices": devices}


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def render(info: dict) -> str:
    lines = [f"backend : {info['backend']} ({info['reason']})",
             f"driver  : CUDA {info['driver_version']}", f"devices : {len(info['devices'])}", ""]
    header = ("#", "name", "cc", "SMs", "memory free/total", "pci bus", "uuid")
    rows = [(str(d["ordinal"]), d["name"], d["compute_capability"],
             str(d["properties"].get("multiprocessor_count", "?")),
             f"{_gib(d['free_memory'])} / {_gib(d['total_memory'])}", d["pci_bus_id"], d["uuid"])
            for d in info["devices"]]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cuctx", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="show the backend, the driver and each device")
    info.add_argument("--json", action="store_true", help="print JSON for scripts")
    demo = sub.add_parser("demo", help="run the examples (the seeds' programs, with cuctx)")
    demo.add_argument("names", nargs="*", metavar="NAME",
                      help=f"which examples (default: all of {', '.join(EXAMPLES)})")
    args = parser.parse_args(argv)
    unknown = [n for n in getattr(args, "names", []) if n not in EXAMPLES]
    if unknown:
        parser.error(f"no example named {', '.join(unknown)}; choose from {', '.join(EXAMPLES)}")
    if args.command == "info":
        data = describe()
        print(json.dumps(data, indent=2) if args.json else render(data))
    else:
        print(f"cuctx {cuctx.__version__} on {cuctx.backend()}")
        for name in args.names or EXAMPLES:
            print(f"\n== {name}")
            importlib.import_module(f"cuctx.examples.{name}").main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
