"""The type stubs describe the compiled module: the same classes, functions and members."""

import ast
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
