"""What the source cuctx compiled says of a kernel's parameters: their names, how a kernel
uses its pointer parameters for the trace (and so the race checker), what they point at
(for the dtype check: `cuctx.kernels._dtypes`) and which are condition handles (for graph
kernel nodes: `cuctx.graphs._conditions`).

Access modes are read ("r"), written ("w") or both ("rw"). In order: an annotation
(`Kernel.set_access`, or ``access=`` of one `cuctx.launch`), then ``const`` in the parameter
list of the source (``const float* x`` is read; ``float* const x`` is a constant pointer to
writable memory: read-write), else read-write. Neither ``const`` nor the pointee's type
survives into PTX (a pointer is a ``.u64``), so the source text is parsed, keyed by the
kernel's name (its C name, or the name a template's or C++ function's lowered name
carries); a template's type parameters take the arguments of its name expression
(``axpy<float>``), and ``typedef``/``using`` aliases of the source are followed.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, NamedTuple

MODES = ("r", "w", "rw")

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_GLOBAL = re.compile(r"__global__\b")
_NAME = re.compile(r"([A-Za-z_]\w*)\s*(<[^()]*>)?\s*\($")
_IDENT = re.compile(r"[A-Za-z_]\w*")
_MANGLED = re.compile(r"_Z(\d+)")
# Between ``__global__`` and the kernel's name: attributes with parentheses of their own.
_ATTRIBUTES = frozenset({"__launch_bounds__", "__cluster_dims__", "__maxnreg__"})
# Between ``template <...>`` and ``__global__``.
_SPECIFIERS = re.compile(r"(?:\b(?:static|inline|__forceinline__|__noinline__)\s*)*$")
# Words of a declaration that say nothing about what a pointer points at.
_QUALIFIERS = re.compile(
    r"\b(?:const|volatile|__restrict__|__restrict|restrict|struct|class|"
    r"union|enum|typename)\b"
)
_ALIAS = re.compile(
    r"\btypedef\s+([^;{}()]+?)\s*\b([A-Za-z_]\w*)\s*;"
    r"|\busing\s+([A-Za-z_]\w*)\s*=\s*([^;{}()]+?)\s*;"
)


class Param(NamedTuple):
    """One parameter as the source declares it."""

    name: str
    mode: str | None  # "r" for a pointer to const, None otherwise
    pointee: str | None  # what a pointer points at, qualifiers dropped: "float", "T", "int*"
    ctype: str  # its type as written (template arguments put in): "const float* __restrict__"


class Definition(NamedTuple):
    """One ``__global__`` definition: a template's parameter names ("" for a non-type one),
    the arguments of an explicit specialization (None for any other), the parameters."""

    template: tuple[str, ...]
    specialized: tuple[str, ...] | None
    params: tuple[Param, ...]


class Parsed(NamedTuple):
    kernels: dict[str, list[Definition]]  # name -> its definitions (overloads, templates)
    aliases: dict[str, str]  # typedef and using: name -> type


def _balanced(text: str, i: int) -> int:
    """The index just past the ')' closing the '(' at ``i``."""
    depth = 0
    for j in range(i, len(text)):
        depth += {"(": 1, ")": -1}.get(text[j], 0)
        if depth == 0:
            return j + 1
    return len(text)


def _split(params: str) -> list[str]:
    """Split a parameter list at its top-level commas (templates and parentheses nest)."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(params):
        if c in "<([":
            depth += 1
        elif c in ">)]":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(params[start:i])
            start = i + 1
    parts.append(params[start:])
    return [p.strip() for p in parts if p.strip() and p.strip() != "void"]


def _type(text: str) -> str:
    """A type without its qualifiers, spaced one way: "unsigned int", "complex<float>*"."""
    text = " ".join(_QUALIFIERS.sub(" ", text).split())
    return re.sub(r"\s*([*<>,&]|::)\s*", r"\1", text)


def _param(text: str) -> Param:
    """One parameter declaration: ``const float* __restrict__ x``, ``int n``, ``T x[]``."""
    text = " ".join(text.split("=")[0].split())
    array = "[" in text
    text = text.split("[")[0].strip()
    names = _IDENT.findall(_QUALIFIERS.sub(" ", text))
    named = len(names) > 1  # else a type alone: an unnamed parameter
    star = text.rfind(names[-1]) if array and named else len(text) if array else text.rfind("*")
    if star < 0:
        name = names[-1] if named else ""
        return Param(name, None, None, text[: text.rfind(name)].strip() if name else text)
    # The name: the last word after the last '*' that is no qualifier (none: unnamed).
    after = _IDENT.findall(_QUALIFIERS.sub(" ", text[star:]))
    name = after[-1] if after else ""
    ctype = re.sub(r"\s+\*", "*", text[: text.rfind(name)].strip() if name else text)
    mode = "r" if re.search(r"\bconst\b", text[:star]) else None
    return Param(name, mode, _type(text[:star]), ctype + "[]" * array)


def _template(text: str, end: int) -> tuple[str, ...]:
    """The parameter names of a ``template <...>`` just before ``end`` ("" for non-type)."""
    head = text[:end]
    head = head[: _SPECIFIERS.search(head).start()].rstrip()
    if not head.endswith(">"):
        return ()
    depth = 0
    for i in range(len(head) - 1, -1, -1):
        depth += {">": 1, "<": -1}.get(head[i], 0)
        if depth == 0:
            break
    if not head[:i].rstrip().endswith("template"):
        return ()
    names = []
    for part in _split(head[i + 1 : -1]):
        words = _IDENT.findall(part.split("=")[0])
        names.append(words[-1] if words and words[0] in ("typename", "class") else "")
    return tuple(names)


def _arguments(expression: str | None) -> tuple[str, ...] | None:
    """The template arguments of ``axpy<float, 4>``: ("float", "4"); None without any."""
    if expression is None or "<" not in expression:
        return None
    return tuple(
        _type(a) for a in _split(expression[expression.find("<") + 1 : expression.rfind(">")])
    )


def parse(source: str) -> Parsed:
    """Every ``__global__`` function of ``source`` and the type aliases it declares."""
    text = _COMMENT.sub(" ", source)
    found: dict[str, list[Definition]] = {}
    for match in _GLOBAL.finditer(text):
        start = match.end()
        while True:
            paren = text.find("(", start)
            name = _NAME.search(text[start : paren + 1]) if paren >= 0 else None
            if name is None or name[1] not in _ATTRIBUTES:
                break
            start = _balanced(text, paren)  # __launch_bounds__(256): the name comes after
        if name is None:
            continue
        end = _balanced(text, paren)
        params = tuple(_param(p) for p in _split(text[paren + 1 : end - 1]))
        found.setdefault(name[1], []).append(
            Definition(_template(text, match.start()), _arguments(name[2]), params)
        )
    aliases: dict[str, str | None] = {}
    for m in _ALIAS.finditer(text):
        alias, of = (m[2], m[1]) if m[1] else (m[3], m[4])
        # Two meanings (one per #if branch, say): which one was compiled is unknown.
        aliases[alias] = _type(of) if aliases.get(alias, _type(of)) == _type(of) else None
    return Parsed(found, {a: of for a, of in aliases.items() if of is not None})


def base_name(kernel_name: str, user_name: str) -> str:
    """The name the source declares: ``axpy`` for "axpy<float>" or ``_Z4axpyPKfPf``."""
    name = user_name if user_name != kernel_name else kernel_name
    mangled = _MANGLED.match(name)
    if mangled:
        return name[mangled.end() : mangled.end() + int(mangled[1])]
    return name.split("<")[0].split("::")[-1].strip()


def _instance(
    definition: Definition, arguments: tuple[str, ...] | None, aliases: dict[str, str]
) -> tuple[Param, ...] | None:
    """The definition's parameters for a kernel of these template arguments (None: the
    definition is a specialization for others)."""
    if definition.specialized is not None and definition.specialized != arguments:
        return None
    bound = dict(zip(definition.template, arguments or ()))
    bound.pop("", None)

    def put(text: str) -> str:
        return _IDENT.sub(lambda m: bound.get(m[0], m[0]), text)

    params = []
    for p in definition.params:
        pointee = p.pointee
        if pointee is not None:
            pointee = _type(put(pointee))
            for _ in range(8):  # typedef chains, not cycles
                pointee = aliases.get(pointee, pointee)
        params.append(p._replace(pointee=pointee, ctype=put(p.ctype) if bound else p.ctype))
    return tuple(params)


def declared(kernel: Any) -> list[Param] | None:
    """The kernel's parameters as its source declares them (None: no source, or no
    definition with its parameter count). Definitions that disagree on a parameter (C++
    overloads) leave its mode and pointee unknown."""
    owner = kernel._owner
    source = getattr(owner, "_source", None)
    if source is None:
        return None
    parsed = getattr(owner, "_access_parsed", None)
    if parsed is None:
        parsed = owner._access_parsed = parse(source)
    count = len(kernel.param_layout)
    user_name = owner._user_name(kernel.name)
    arguments = _arguments(user_name)
    lists = [
        params
        for d in parsed.kernels.get(base_name(kernel.name, user_name), ())
        if (params := _instance(d, arguments, parsed.aliases)) is not None and len(params) == count
    ]
    if not lists:
        return None
    merged = []
    for params in zip(*lists):  # overloads agree on a parameter, or it is unknown
        modes, pointees = {p.mode for p in params}, {p.pointee for p in params}
        merged.append(
            params[0]._replace(
                mode=modes.pop() if len(modes) == 1 else None,
                pointee=pointees.pop() if len(pointees) == 1 else None,
            )
        )
    return merged


# The types of a condition handle (cudaGraphSetConditional's first parameter).
_CONDITION_TYPES = frozenset({"cudaGraphConditionalHandle", "CUgraphConditionalHandle"})


def condition_params(kernel: Any) -> tuple[tuple[int, str], ...]:
    """(index, declaration) of each parameter the kernel's source declares as a condition
    handle (``cudaGraphConditionalHandle``, through its typedefs too); () without source.
    Read from the source once per kernel (a graph asks it for every kernel node)."""
    found = kernel._conditions
    if found is None:
        found = kernel._conditions = _condition_params(kernel)
    return found


def _condition_params(kernel: Any) -> tuple[tuple[int, str], ...]:
    params = declared(kernel)
    if not params:
        return ()
    aliases = kernel._owner._access_parsed.aliases
    found = []
    for index, p in enumerate(params):
        ctype = _type(p.ctype)
        for _ in range(8):  # typedef chains, not cycles
            ctype = aliases.get(ctype, ctype)
        if ctype in _CONDITION_TYPES:
            found.append((index, f"{p.ctype} {p.name}".strip()))
    return tuple(found)


def keyed(kernel: Any, given: Mapping[str | int, Any]) -> dict[int, Any]:
    """``given`` (parameter name or index -> value) keyed by index; a name or index the
    kernel does not have is a ValueError."""
    names = [p.name for p in declared(kernel) or ()]
    count = len(kernel.param_layout)
    out = {}
    for key, value in given.items():
        if isinstance(key, str):
            if key not in names:
                raise ValueError(
                    f"kernel {kernel.name!r} has no parameter called {key!r}"
                    + (
                        f" (its parameters: {', '.join(names)})"
                        if names
                        else " that cuctx knows of (no source was compiled): name it by index"
                    )
                )
            key = names.index(key)
        if not isinstance(key, int) or not 0 <= key < count:
            raise ValueError(f"kernel {kernel.name!r} has parameters 0 to {count - 1}, not {key!r}")
        out[key] = value
    return out


def resolve(kernel: Any, given: Mapping[str | int, str]) -> dict[int, str]:
    """``given`` (parameter name or index -> mode) checked and keyed by index."""
    for key, mode in given.items():
        if mode not in MODES:
            raise ValueError(
                f"access mode {mode!r} for parameter {key!r} of "
                f"{kernel.name!r}: use 'r', 'w' or 'rw'"
            )
    return keyed(kernel, given)


def modes(kernel: Any, override: Mapping[int, str] | None = None) -> tuple[str, ...]:
    """One mode per parameter: ``override`` (a launch's), the kernel's annotation, const in
    its source, else read-write."""
    base = kernel._access_modes
    if base is None:
        source = declared(kernel) or ()
        modes_ = ["rw" if p.mode is None else p.mode for p in source] or ["rw"] * len(
            kernel.param_layout
        )
        for index, mode in (kernel._access or {}).items():
            modes_[index] = mode
        base = kernel._access_modes = tuple(modes_)
    if override:
        base = tuple(override.get(i, m) for i, m in enumerate(base))
    return base
