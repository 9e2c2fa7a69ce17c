"""The cuctx command line: what cuctx finds on this machine, and examples of what it does.

  python -m cuctx info [--json]   versions, the backend, the driver and each device
  python -m cuctx demo [NAME...]  run the examples, saying what each one shows

Errors: one line on stderr and exit status 1, for a mistake on the command line too; the
line says what was wrong and what to do ("python -m cuctx: error: ..."), and an example that
fails names itself and the command that shows its traceback. With --json on the command line
the line is a JSON object, {"error": message, "type": "ValueError"} ("type": "UsageError" for
a mistake on the command line), so stdout holds only results. Ctrl-C: one line, exit status
130. A reader that leaves early (| head): no message, exit status 1.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import textwrap
from typing import NoReturn

import numpy as np

import cuctx
from cuctx.kernels._compiler import cache_directory, nvrtc_version
from cuctx.examples import EXAMPLES

_KEY_PROPERTIES = (
    "multiprocessor_count",
    "max_threads_per_block",
    "max_shared_memory_per_block_optin",
    "l2_cache_size",
    "clock_rate",
    "memory_clock_rate",
    "global_memory_bus_width",
    "unified_addressing",
    "concurrent_managed_access",
)


def _nvrtc() -> str:
    try:
        major, minor = nvrtc_version()
    except RuntimeError as exc:  # Library.from_source needs it; everything else works without
        return f"unavailable ({exc})"
    return f"{major}.{minor}"


def _libcuda_path(backend: cuctx._driver.Backend) -> str | None:
    """The driver library the cuda backend has loaded; None on the sim, which loads none."""
    if backend.sim is not None:
        return None
    from cuda.pathfinder import load_nvidia_dynamic_lib

    # cuda.bindings loads libcuda through this function, and its cache hands back that same
    # library: nothing is loaded a second time.
    return load_nvidia_dynamic_lib("cuda").abs_path


def describe() -> dict:
    """Everything `info` shows, as plain data (what `info --json` prints)."""
    backend = cuctx.backend()
    version = backend.driver.cuDriverGetVersion()[1]
    cache = cache_directory()
    devices = []
    for device in cuctx.devices():
        free, total = device.mem_info()
        props = device.properties.as_dict()
        devices.append(
            {
                "ordinal": device.ordinal,
                "name": device.name,
                "uuid": device.uuid,
                "pci_bus_id": device.pci_bus_id,
                "compute_capability": str(device.compute_capability),
                "total_memory": total,
                "free_memory": free,
                "properties": {k: props[k] for k in _KEY_PROPERTIES if k in props},
            }
        )
    return {
        "versions": {
            "cuctx": cuctx.__version__,
            "python": platform.python_version(),
            "os": platform.platform(),
            "cuda_bindings": _cuda_bindings_version(),
            "nvrtc": _nvrtc(),
            "numpy": np.__version__,
        },
        "backend": backend.name,
        "reason": backend.reason,
        # On the sim the driver version is the one it models, and event times come from its
        # virtual clock: both are simulated, not measured.
        "simulated": backend.sim is not None,
        "native_fast_path": backend.native is not None,
        "native_reason": backend.native_reason,
        "driver_version": f"{version // 1000}.{version % 1000 // 10}",
        "libcuda": _libcuda_path(backend),
        "compile_cache": None if cache is None else str(cache),
        "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith("CUCTX_")},
        "devices": devices,
    }


def _cuda_bindings_version() -> str:
    import cuda.bindings

    return cuda.bindings.__version__


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def render(info: dict) -> str:
    """`describe()` as the text `info` prints: one `key : value` line each, then a device table."""
    sim = info["simulated"]
    v = info["versions"]
    fields = [
        ("cuctx", v["cuctx"]),
        ("Python", v["python"]),
        ("OS", v["os"]),
        ("cuda-bindings", v["cuda_bindings"]),
        ("NVRTC", v["nvrtc"]),
        ("NumPy", v["numpy"]),
        ("backend", f"{info['backend']} ({info['reason']})"),
        (
            "driver",
            f"CUDA {info['driver_version']}"
            + (" (simulated: the version the sim models)" if sim else ""),
        ),
        (
            "libcuda",
            info["libcuda"]
            or ("none (the simulated GPU needs no driver)" if sim else "loaded, path unknown"),
        ),
        (
            "native fast path",
            f"yes ({info['native_reason']})"
            if info["native_fast_path"]
            else f"no ({info['native_reason']})",
        ),
        ("compile cache", info["compile_cache"] or "off (CUCTX_CACHE_DIR is empty)"),
        (
            "environment",
            ", ".join(f"{k}={val}" for k, val in info["environment"].items())
            or "no CUCTX_* variables set",
        ),
    ]
    if sim:
        fields.append(("timings", "simulated: event times come from the sim's virtual clock"))
    fields.append(("devices", str(len(info["devices"]))))
    width = max(len(key) for key, _ in fields)
    lines = [f"{key.ljust(width)} : {value}" for key, value in fields]
    lines.append("")
    header = ("#", "name", "cc", "SMs", "memory free/total", "pci bus", "uuid")
    rows = [
        (
            str(d["ordinal"]),
            d["name"],
            d["compute_capability"],
            str(d["properties"].get("multiprocessor_count", "?")),
            f"{_gib(d['free_memory'])} / {_gib(d['total_memory'])}",
            d["pci_bus_id"],
            d["uuid"],
        )
        for d in info["devices"]
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return "\n".join(lines)


def _info(args: argparse.Namespace) -> None:
    data = describe()
    print(json.dumps(data, indent=2) if args.json else render(data))


def _demo(args: argparse.Namespace) -> None:
    backend = cuctx.backend()
    print(f"cuctx {cuctx.__version__} on {backend}")
    if backend.sim is not None:
        print("The simulated GPU computes every result for real; its times are simulated.")
    for name in args.names or EXAMPLES:
        example = EXAMPLES[name]
        print(f"\n== {example.title} (python -m cuctx demo {name})")
        print(f"Shows: {example.shows}\nLook at: {example.look_at}\n")
        try:
            importlib.import_module(f"cuctx.examples.{name}").main()
        except BrokenPipeError:  # `demo | head`: the reader left; no fault of the example
            raise
        except Exception as exc:
            raise _ExampleFailed(name) from exc


class _ExampleFailed(Exception):
    """An example raised (its exception is the ``__cause__``): the error line names both."""


def _examples_epilog() -> str:
    text = ["examples:"]
    for e in EXAMPLES.values():
        text.append(f"  {e.name}: {e.title}")
        text += textwrap.wrap(e.shows, 76, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(text)


def _prog() -> str:
    """How the user called us: the `cuctx` script that pip installs, or `python -m cuctx`."""
    return "cuctx" if os.path.basename(sys.argv[0]) == "cuctx" else "python -m cuctx"


class UsageError(Exception):
    """A mistake on the command line: the message says what was wrong and which --help to
    read. (Its name is the "type" of `--json`'s error object.)"""


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors raised to `main` (which prints them as one line, exit
    status 1) instead of printed with the usage text and exit status 2."""

    commands: dict[str, argparse.ArgumentParser]  # the sub-commands, by name

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _parser() -> _Parser:
    # No abbreviated options: `main` looks for --json before parsing, to know how to print a
    # usage error, so --json has to be its one spelling.
    parser = _Parser(
        prog=_prog(),
        description=__doc__,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"cuctx {cuctx.__version__}")
    sub = parser.add_subparsers(dest="command")  # none given: `_parse` says which there are
    info = sub.add_parser(
        "info", help="show versions, the backend, the driver and each device", allow_abbrev=False
    )
    info.add_argument(
        "--json",
        action="store_true",
        help='print JSON for scripts (an error too: {"error": ..., "type": ...})',
    )
    info.set_defaults(run=_info)
    demo = sub.add_parser(
        "demo",
        help="run the examples, saying what each one shows",
        epilog=_examples_epilog(),
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"which examples (default: all of {', '.join(EXAMPLES)})",
    )
    demo.set_defaults(run=_demo)
    parser.commands = sub.choices
    return parser


def _parse(parser: _Parser, argv: list[str]) -> argparse.Namespace:
    """The command line parsed, or a `UsageError` that ends with the --help to read."""
    # Before the command only flags are taken, so the first word that is not one is the command.
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    if command is not None and command not in parser.commands:
        raise UsageError(
            f"there is no command {command!r}: the commands are "
            f"{' and '.join(parser.commands)}; see '{parser.prog} --help'"
        )
    see = f"see '{parser.prog} {command} --help'" if command else f"see '{parser.prog} --help'"
    try:
        args = parser.parse_args(argv)  # --help and --version print and exit with status 0
    except UsageError as exc:
        raise UsageError(f"{exc}; {see}") from None
    if args.command is None:
        raise UsageError(f"say which command to run: {' or '.join(parser.commands)}; {see}")
    unknown = [name for name in getattr(args, "names", []) if name not in EXAMPLES]
    if unknown:
        raise UsageError(
            f"there is no example {' or '.join(map(repr, unknown))}: the examples "
            f"are {', '.join(EXAMPLES)}; {see}"
        )
    return args


def _describe_error(exc: BaseException) -> tuple[str, str]:
    """(type name, message on one line) of an error; for an example, of what it raised."""
    where = ""
    if isinstance(exc, _ExampleFailed):
        name, exc = exc.args[0], exc.__cause__
        where = f" (in the example {name}; `python -m cuctx.examples.{name}` shows the traceback)"
    return type(exc).__name__, " ".join(str(exc).split()) + where


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser()
    as_json = any(arg.split("=", 1)[0] == "--json" for arg in argv)  # --json=x is a mistake too
    try:
        args = _parse(parser, argv)
        args.run(args)
        sys.stdout.flush()  # a closed pipe shows up here, not at interpreter exit
        return 0
    except BrokenPipeError:  # `python -m cuctx info | head -3`: the reader left; say nothing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (Exception, KeyboardInterrupt) as exc:
        kind, message = _describe_error(exc)
        if as_json:
            print(json.dumps({"error": message, "type": kind}), file=sys.stderr)
        elif isinstance(exc, UsageError):  # the message alone, as command lines' errors are
            print(f"{parser.prog}: error: {message}", file=sys.stderr)
        else:
            line = f"{kind}: {message}" if message else kind  # e.g. a bare KeyboardInterrupt
            print(f"{parser.prog}: error: {line}", file=sys.stderr)
        return 130 if isinstance(exc, KeyboardInterrupt) else 1


if __name__ == "__main__":
    sys.exit(main())
