"""Each compiled accelerator's ``.pyi`` stub is held to the module it types, so the two cannot
drift: (a) the stub declares exactly the public names the module exports (and each class's
public members); (b) every function's, constructor's and method's parameters in the stub are
the C's (names, kinds, defaults) as ``inspect.signature`` reads them from the C's signature
docstring; (c) the C refuses one positional argument too many and one too few, and what it
says when it refuses (CPython's count, or the C's own usage line) agrees with the stub. The
Core's methods also keep their Python twins' (Ring's) parameters."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

MODULES = ("zcnet.uring._accel", "zcnet.aio._loopaccel", "zcnet.rx.zc._rxaccel")
ANY = object()  # a probe argument: the C must refuse the count before reading any


def _module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError:
        pytest.skip(f"{name} is not built (no C compiler)")


def _stub(mod: ModuleType) -> ast.Module:
    path = Path(mod.__file__ or "").with_name(mod.__name__.rsplit(".", 1)[1] + ".pyi")
    return ast.parse(path.read_text(), str(path))


def _default(node: ast.expr) -> object:
    return ast.literal_eval(node)  # ``...`` is Ellipsis, as in the C's signature text


def _signature(fn: ast.FunctionDef, method: bool) -> inspect.Signature:
    """The stub function's parameters, without annotations (the C's have none); a method's
    ``self`` left out."""
    a = fn.args
    P = inspect.Parameter
    positional = [(x, P.POSITIONAL_ONLY) for x in a.posonlyargs]
    positional += [(x, P.POSITIONAL_OR_KEYWORD) for x in a.args]
    defaults = [P.empty] * (len(positional) - len(a.defaults)) + [_default(d) for d in a.defaults]
    params = [P(x.arg, kind, default=d) for (x, kind), d in zip(positional, defaults, strict=True)]
    if a.vararg:
        params.append(P(a.vararg.arg, P.VAR_POSITIONAL))
    params += [P(x.arg, P.KEYWORD_ONLY, default=P.empty if d is None else _default(d))
               for x, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
    if a.kwarg:
        params.append(P(a.kwarg.arg, P.VAR_KEYWORD))
    return inspect.Signature(params[1:] if method else params)


def _without_self(sig: inspect.Signature) -> inspect.Signature:
    return sig.replace(parameters=list(sig.parameters.values())[1:])


def _bare(sig: inspect.Signature) -> inspect.Signature:
    """``sig`` without annotations (a Python twin's)."""
    return sig.replace(parameters=[p.replace(annotation=p.empty)
                                   for p in sig.parameters.values()],
                       return_annotation=sig.empty)


def _public(names: object) -> set[str]:
    return {n for n in names if not n.startswith("_")}  # type: ignore[attr-defined]


def _defs(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    """The names a stub body declares (functions, classes, annotated variables)."""
    out: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            out[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
    return out


def _functions(mod: ModuleType) -> Iterator[tuple[str, ast.FunctionDef, Callable[..., object],
                                                  bool]]:
    """(qualified name, stub def, runtime object, is a method) for every function, constructor
    and method the stub declares with a signature the C gives (slot dunders have none)."""
    for name, node in _defs(_stub(mod).body).items():
        obj = getattr(mod, name)
        if isinstance(node, ast.FunctionDef):
            yield name, node, obj, False
        elif isinstance(node, ast.ClassDef):
            for mname, m in _defs(node.body).items():
                if not isinstance(m, ast.FunctionDef) or m.decorator_list:
                    continue
                if mname == "__init__":
                    yield name, m, obj, True
                elif not mname.startswith("__"):
                    yield f"{name}.{mname}", m, getattr(obj, mname), True


# --- (a) the same names ----------------------------------------------------------------------

@pytest.mark.parametrize("name", MODULES)
def test_the_stub_declares_exactly_what_the_module_exports(name: str) -> None:
    mod = _module(name)
    defs = _defs(_stub(mod).body)
    assert _public(defs) == _public(dir(mod))
    for n, node in defs.items():
        obj = getattr(mod, n)
        if isinstance(node, ast.ClassDef):
            assert isinstance(obj, type), n
            members = _defs(node.body)
            assert _public(members) == _public(vars(obj)), n
            for dunder in set(members) - _public(members) - {"__init__"}:
                assert dunder in vars(obj), f"{n}.{dunder} is in the stub, not in the C"
        elif isinstance(node, ast.FunctionDef):
            assert callable(obj) and not isinstance(obj, type), n
        else:
            assert isinstance(node, ast.AnnAssign)
            ann = node.annotation
            base = ann.value if isinstance(ann, ast.Subscript) else ann
            assert isinstance(base, ast.Name), n
            assert type(obj).__name__ == base.id, f"{n} is {type(obj).__name__}, not {base.id}"


# --- (b) the same parameters -----------------------------------------------------------------

@pytest.mark.parametrize("name", MODULES)
def test_every_signature_in_the_stub_is_the_one_the_c_declares(name: str) -> None:
    mod = _module(name)
    checked = 0
    for qual, node, obj, method in _functions(mod):
        runtime = inspect.signature(obj)  # from the C's "name(...)\n--\n\n" docstring
        if method and not isinstance(obj, type):
            runtime = _without_self(runtime)
        assert _signature(node, method) == runtime, qual
        checked += 1
    assert checked


def test_the_core_methods_keep_their_python_twins_parameters() -> None:
    accel = _module("zcnet.uring._accel")
    from zcnet.uring.accel_bind import ACCEL_METHODS
    from zcnet.uring.ring import Ring

    for m in ACCEL_METHODS:
        twin = _bare(_without_self(inspect.signature(getattr(Ring, f"_{m}_py"))))
        assert _without_self(inspect.signature(getattr(accel.Core, m))) == twin, m


# --- (c) the C refuses the counts the stub does not allow ---------------------------------------

COUNT = {  # CPython's wordings of a refused count -> what they say about (min, max)
    r"takes no arguments": lambda m: (0, 0),
    r"takes exactly one argument": lambda m: (1, 1),
    r"takes exactly (\d+) arguments?": lambda m: (int(m[1]), int(m[1])),
    r"takes at most (\d+) arguments?": lambda m: (None, int(m[1])),
    r"takes at least (\d+) arguments?": lambda m: (int(m[1]), None),
}
# A Python twin's wordings (the Core hands what it does not take to its Ring's method)
BOUND = {
    r"takes from (\d+) to (\d+) positional arguments": lambda m: (int(m[1]) - 1, int(m[2]) - 1),
    r"takes (\d+) positional arguments? but": lambda m: (None, int(m[1]) - 1),
}


def _refusal(call: Callable[..., object], n: int) -> str:
    with pytest.raises(TypeError) as e:
        call(*[ANY] * n)
    return str(e.value)


def _agrees(msg: str, short: str, node: ast.FunctionDef, method: bool) -> None:
    """Assert that refusal ``msg`` agrees with the stub's positional parameters."""
    params = [p for p in _signature(node, method).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p.name for p in params if p.default is p.empty]
    lo, hi = len(required), len(params)
    usage = re.fullmatch(rf"{short}\((.*)\)", msg)
    if usage:  # the C's own usage line: its parameter names, in order
        named = [re.split(r"[:=]", p)[0].strip() for p in usage[1].split(",") if p.strip()]
        assert named == [p.name for p in params], msg
        return
    missing = re.search(r"missing \d+ required positional arguments?: (.*)", msg)
    if missing:
        names = re.findall(r"'(\w+)'", missing[1])
        assert names == required[len(required) - len(names):], msg
        return
    for table in (COUNT, BOUND):
        for pattern, says in table.items():
            m = re.search(pattern, msg)
            if m:
                want_lo, want_hi = says(m)
                assert want_lo in (None, lo) and want_hi in (None, hi), (msg, lo, hi)
                return
    pytest.fail(f"not a refusal of the argument count: {msg!r}")


def _probe(call: Callable[..., object], short: str, node: ast.FunctionDef,
           method: bool) -> None:
    params = [p for p in _signature(node, method).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    lo = sum(p.default is p.empty for p in params)
    _agrees(_refusal(call, len(params) + 1), short, node, method)
    if lo:
        _agrees(_refusal(call, lo - 1), short, node, method)


def _instances(mod: ModuleType, stack: list[Callable[[], None]]) -> dict[str, object]:
    """An object of each class whose methods the probes call: a live Core (its methods check
    the ring first), the rest made without their __init__ (their methods check the count
    first), and a CopySend made for real (its call checks the object first)."""
    out: dict[str, object] = {}
    if mod.__name__ == "zcnet.uring._accel":
        from zcnet.uring.ring import Ring

        ring = Ring(8)
        stack.append(ring.close)
        out["Core"] = ring.__dict__["_core"]
    elif mod.__name__ == "zcnet.aio._loopaccel":
        for cls in ("Router", "Round", "Anext"):
            out[cls] = getattr(mod, cls).__new__(getattr(mod, cls))
        out["CopySend"] = mod.CopySend(object(), object(), 0, lambda: False)
    return out


@pytest.mark.parametrize("name", MODULES)
def test_the_c_refuses_the_argument_counts_the_stub_does_not_allow(name: str) -> None:
    mod = _module(name)
    if name == "zcnet.rx.zc._rxaccel":
        import zcnet.rx.zc  # noqa: F401  # binds the chunk classes: make_chunks checks that first
    closers: list[Callable[[], None]] = []
    try:
        objs = _instances(mod, closers)
        for qual, node, obj, method in _functions(mod):
            if isinstance(obj, type) or not method:  # a constructor or a module function
                _probe(obj, qual, node, method)
            else:
                cls, meth = qual.split(".")
                _probe(getattr(objs[cls], meth), meth, node, True)
        for cls, obj in objs.items():  # __call__: a slot, no signature to read
            node = _defs(next(n for n in _stub(mod).body
                              if isinstance(n, ast.ClassDef) and n.name == cls).body
                         ).get("__call__")
            if isinstance(node, ast.FunctionDef):
                _probe(obj, cls, node, True)  # type: ignore[arg-type]
    finally:
        for close in closers:
            close()

