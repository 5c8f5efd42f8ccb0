"""The type stubs describe the compiled module: the same classes, functions, attributes and
members."""

import ast
import inspect
import os

import kvpool
from kvpool import _kvpool


def stub_names():
    path = os.path.join(os.path.dirname(kvpool.__file__), "_kvpool.pyi")
    tree = ast.parse(open(path).read())
    top, members = set(), {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top.add(node.name)
        if isinstance(node, ast.AnnAssign):  # a module attribute (POOL_COUNTERS)
            top.add(node.target.id)
        if isinstance(node, ast.ClassDef):
            members[node.name] = {
                n.name if isinstance(n, ast.FunctionDef) else n.target.id
                for n in node.body if isinstance(n, (ast.FunctionDef, ast.AnnAssign))}
    return top, members


def test_stubs_name_every_public_class_and_function():
    top, _ = stub_names()
    public = {n for n in dir(_kvpool) if not n.startswith("__")}
    assert top == public


def test_stub_members_exist_on_the_classes():
    _, members = stub_names()
    for cls, names in members.items():
        missing = {n for n in names if n not in ("__init__",) and not hasattr(getattr(_kvpool, cls), n)}
        # Error's attributes are set on each instance.
        assert missing <= {"code", "name", "message"}, (cls, missing)


def stub_properties():
    """(class, member) pairs the stubs declare read-only (@property)."""
    path = os.path.join(os.path.dirname(kvpool.__file__), "_kvpool.pyi")
    out = set()
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, ast.ClassDef):
            for n in node.body:
                if isinstance(n, ast.FunctionDef) and any(
                        isinstance(d, ast.Name) and d.id == "property" for d in n.decorator_list):
                    out.add((node.name, n.name))
    return out


def test_the_stubs_say_read_only_where_the_module_is():
    # A member the module cannot set is a @property in the stubs, and the reverse.
    for cls_name in {c for c, _ in stub_properties()} | {"BlockHash"}:
        cls = getattr(_kvpool, cls_name)
        for name, member in vars(cls).items():
            if name.startswith("_") or not isinstance(member, property):
                continue
            read_only = member.fset is None
            assert read_only == ((cls_name, name) in stub_properties()), (cls_name, name)


def test_every_public_name_has_a_docstring():
    missing = []
    for name in dir(kvpool):
        obj = getattr(kvpool, name)
        if name.startswith("_") or inspect.ismodule(obj):
            continue
        if not (obj.__doc__ or "").strip():
            missing.append(name)
        if inspect.isclass(obj):
            for member_name, member in vars(obj).items():
                if member_name.startswith("_"):
                    continue
                doc = (getattr(member, "__doc__", None) or "").strip()
                # pybind11 gives a bare signature ("(self) -> int") to undocumented members.
                if not doc or doc.startswith("(self"):
                    missing.append(f"{name}.{member_name}")
    assert missing == []
