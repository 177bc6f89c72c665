"""Every documented recipe key is read by the code it configures.

docs/recipe_keys.md promises that each key changes something. A key that validates but that no
code reads is worse than an unknown one, which is refused: the recipe says one thing and the run
does another, silently. This test finds such keys statically, in about a second.

How: every leaf key of ``HetrlConfig`` (a dotted path, as in docs/recipe_keys.md) is a chain of
attribute reads from the root, ``reward.sandbox.limits.wall_s`` being ``HetrlConfig.reward``,
``RewardConfig.sandbox``, ``SandboxConfig.limits`` and ``SandboxLimits.wall_s``. A key is read
when every link of its chain is read somewhere outside src/hetrl/config/, that is when some
expression whose config class the test can tell has that attribute loaded from it. Requiring the
whole chain, not only the last name, is what keeps it precise: generic names (``name``,
``workers``, ``path``) are read on many classes, and a section class may be read (the sandbox
reads ``SandboxConfig.limits``) while the recipe's own instance of it never reaches that code
(nothing reads ``RewardConfig.sandbox``).

An expression's config class comes from what the code states, resolved through its
``from hetrl.config... import`` lines: parameter and variable annotations, calls of a config
class or of a function annotated to return one (by name: ``validate_tree``), ``model_copy`` of a typed
expression, a section attribute of a typed expression, and the names and ``self.`` attributes
bound from such expressions (within a function, a class's methods, or a loop over a list of
sections). Within the config package only the properties and plain methods of the config classes
count, and only as far as code outside it calls them: ``algorithm.resolved_advantage`` read by the
trainer reads ``advantage`` and ``name``. Validators (and the login-node checks of paths.py) do
not count: refusing a combination is not acting on it.

A read the inference cannot type makes a key look unread: a field read from an unannotated
parameter, a section passed on whole (``**section.model_dump()``) or read through ``getattr``
with a computed name. Annotate the reader rather than allowlist the key. The other way round, the
test is per class, not per instance: once the recipe's instance of a section is reached, a field
read on any instance of its class counts (env.tasks and env.eval_tasks share one class), and so
does a read that only displays the value. The Slurm templates hold no config placeholders
(hetrl.launch.sbatch renders them in Python, which is scanned).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from pydantic import BaseModel

from hetrl.config.schema import HetrlConfig

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "src" / "hetrl" / "config"
READERS = [
    REPO / "launch.py",
    *(p for p in sorted((REPO / "src" / "hetrl").rglob("*.py")) if CONFIG_DIR not in p.parents),
]

# Unread keys this test found whose fix is not a wiring slip or lies in code others are changing:
# key -> what would read it. Each is a bug to fix, not an exemption.
UNREAD: dict[str, str] = {}

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_VALIDATORS = {"model_validator", "field_validator"}


def _section(annotation) -> type[BaseModel] | None:
    """The config class a field holds (alone, optional or in a list), None for a leaf value."""
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _classes() -> dict[str, type[BaseModel]]:
    """Every config class reachable from the root, by name."""
    found, todo = {}, [HetrlConfig]
    while todo:
        model = todo.pop()
        found[model.__name__] = model
        todo += [
            sub
            for field in model.model_fields.values()
            if (sub := _section(field.annotation)) and sub.__name__ not in found
        ]
    return found


CLASSES = _classes()
# class name -> {section field -> class name of the section it holds}
SECTIONS = {
    name: {field: sub.__name__ for field, info in model.model_fields.items() if (sub := _section(info.annotation))}
    for name, model in CLASSES.items()
}


def leaf_keys() -> dict[str, list[tuple[str, str]]]:
    """Every documented key -> the (config class, attribute) reads that reach it from the root."""
    keys, todo = {}, [(HetrlConfig, "", [])]
    while todo:
        model, prefix, chain = todo.pop()
        for field, info in model.model_fields.items():
            link = [*chain, (model.__name__, field)]
            sub = _section(info.annotation)
            if sub is None:
                keys[prefix + field] = link
            else:
                todo.append((sub, f"{prefix}{field}.", link))
    return keys


def _scope_nodes(stmts: list[ast.stmt]):
    """The nodes of one scope: everything under ``stmts`` but the bodies of nested functions and classes."""
    todo = list(stmts)
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))


def _bound_name(target: ast.expr) -> str | None:
    """The name an assignment binds: ``x``, or ``self.x`` for an attribute of the instance."""
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
        return f"self.{target.attr}"
    return None


class _Module:
    """Types the expressions of one module and collects the (config class, attribute) pairs it loads."""

    def __init__(self, tree: ast.Module, returns: dict[str, set[str]]) -> None:
        self.tree = tree
        self.returns = returns  # function name -> config classes it is annotated to return
        self.local = {}  # name in this module -> config class name
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hetrl.config"):
                self.local |= {alias.asname or alias.name: alias.name for alias in node.names if alias.name in CLASSES}
            elif isinstance(node, ast.ClassDef) and node.name in CLASSES:
                self.local[node.name] = node.name

    def annotation(self, node: ast.expr | None) -> set[str]:
        if node is None:
            return set()
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return self.annotation(ast.parse(node.value, mode="eval").body)
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        return {self.local[n] for n in names if n in self.local}

    def types(self, node: ast.expr, env: dict[str, set[str]]) -> set[str]:
        """The config classes ``node`` may evaluate to (an element's, for a list of sections)."""
        if isinstance(node, ast.Name):
            return env.get(node.id, set())
        if isinstance(node, ast.Attribute):
            bound = _bound_name(node)
            if bound in env:
                return env[bound]
            return {SECTIONS[t][node.attr] for t in self.types(node.value, env) if node.attr in SECTIONS[t]}
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "model_copy":
                return self.types(func.value, env)
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name in self.local:
                return {self.local[name]}
            return self.returns.get(name, set())
        if isinstance(node, ast.BoolOp):
            return set().union(*(self.types(value, env) for value in node.values))
        if isinstance(node, ast.IfExp):
            return self.types(node.body, env) | self.types(node.orelse, env)
        if isinstance(node, ast.Subscript):
            return self.types(node.value, env)
        return set()

    def bind(self, nodes: list[ast.AST], env: dict[str, set[str]]) -> None:
        """Add the names these nodes bind to typed values to ``env``, until nothing changes (a = cfg.reward; b =
        a.sandbox)."""

        def assign(target: ast.expr, value: ast.expr) -> bool:
            if (
                isinstance(target, (ast.Tuple, ast.List))
                and isinstance(value, (ast.Tuple, ast.List))
                and len(target.elts) == len(value.elts)
            ):
                return any([assign(t, v) for t, v in zip(target.elts, value.elts)])
            return add(_bound_name(target), self.types(value, env))

        def add(name: str | None, types: set[str]) -> bool:
            if name is None or types <= env.get(name, set()):
                return False
            env[name] = env.get(name, set()) | types
            return True

        def loop(target: ast.expr, iterable: ast.expr) -> bool:
            literal = isinstance(iterable, (ast.Tuple, ast.List))
            return any([assign(target, item) for item in iterable.elts] if literal else [assign(target, iterable)])

        binders = [
            n
            for n in nodes
            if isinstance(n, (ast.Assign, ast.AnnAssign, ast.NamedExpr, ast.For, ast.AsyncFor, ast.comprehension))
        ]
        changed = True
        while changed:
            changed = False
            for node in binders:
                if isinstance(node, ast.Assign):
                    changed |= any([assign(target, node.value) for target in node.targets])
                elif isinstance(node, ast.AnnAssign):
                    changed |= add(_bound_name(node.target), self.annotation(node.annotation))
                    changed |= node.value is not None and assign(node.target, node.value)
                elif isinstance(node, ast.NamedExpr):
                    changed |= assign(node.target, node.value)
                elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                    changed |= loop(node.target, node.iter)

    def reads(self, nodes: list[ast.AST], env: dict[str, set[str]]) -> set[tuple[str, str]]:
        return {
            (t, node.attr)
            for node in nodes
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
            for t in self.types(node.value, env)
        }

    def scope(self, stmts: list[ast.stmt], env: dict[str, set[str]]) -> set[tuple[str, str]]:
        """What a block of code (a module, a function body) and everything nested in it reads."""
        env = dict(env)  # nested scopes see the enclosing bindings, not the other way round
        nodes = list(_scope_nodes(stmts))
        self.bind(nodes, env)
        found = self.reads(nodes, env)
        for node in nodes:
            if isinstance(node, _FUNCTIONS):
                found |= self.scope(node.body, self.parameters(node, env))
            elif isinstance(node, ast.ClassDef):
                found |= self.klass(node, env)
        return found

    def parameters(self, fn: ast.FunctionDef | ast.AsyncFunctionDef, env: dict[str, set[str]]) -> dict[str, set[str]]:
        env = dict(env)
        args = fn.args
        for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
            if arg is not None:
                env.pop(arg.arg, None)
                if types := self.annotation(arg.annotation):
                    env[arg.arg] = types
        return env

    def klass(self, node: ast.ClassDef, env: dict[str, set[str]]) -> set[tuple[str, str]]:
        """A class's reads; its methods share the ``self.`` attributes any of them binds."""
        env = dict(env)
        methods = [m for m in node.body if isinstance(m, _FUNCTIONS)]
        self.bind(list(_scope_nodes(node.body)), env)  # class-level annotations of attributes
        bodies = [list(_scope_nodes(m.body)) for m in methods]
        while True:
            before = {k: set(v) for k, v in env.items()}
            for method, body in zip(methods, bodies):
                local = self.parameters(method, env)
                self.bind(body, local)
                env |= {name: types for name, types in local.items() if name.startswith("self.")}
            if env == before:
                break
        return self.scope([m for m in node.body if not isinstance(m, _FUNCTIONS)], env) | set().union(
            *(self.scope(m.body, self.parameters(m, env)) for m in methods)
        )

    def config_methods(self, tree: ast.Module) -> dict[tuple[str, str], set[tuple[str, str]]]:
        """(config class, property or method) -> what its body reads; validators are left out."""
        found = {}
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in CLASSES):
            for method in (m for m in cls.body if isinstance(m, _FUNCTIONS)):
                decorators = {
                    d.func.id for d in method.decorator_list if isinstance(d, ast.Call) and isinstance(d.func, ast.Name)
                }
                if not decorators & _VALIDATORS:
                    found[(cls.name, method.name)] = self.scope(
                        method.body, {**self.parameters(method, {}), "self": {cls.name}}
                    )
        return found


@functools.cache
def read_pairs() -> frozenset[tuple[str, str]]:
    """Every (config class, attribute) pair loaded outside the config package, config-class
    properties and methods standing for the fields they use."""
    # Only a module that imports from hetrl.config, or calls a function annotated to return a config
    # class, can hold a typed expression: the others are not even parsed (they are two thirds).
    sources = {path: path.read_text() for path in [*READERS, *sorted(CONFIG_DIR.glob("*.py"))]}
    returns: dict[str, set[str]] = {}  # complete before any module types a call
    modules = {
        path: _Module(ast.parse(text, str(path)), returns) for path, text in sources.items() if "hetrl.config" in text
    }
    for module in modules.values():
        for fn in (n for n in module.tree.body if isinstance(n, _FUNCTIONS)):
            if types := module.annotation(fn.returns):
                returns[fn.name] = returns.get(fn.name, set()) | types
    modules |= {
        path: _Module(ast.parse(text, str(path)), returns)
        for path, text in sources.items()
        if path not in modules and any(f"{name}(" in text for name in returns)
    }
    reads, methods = set(), {}
    for path, module in modules.items():
        if CONFIG_DIR in path.parents:
            methods |= module.config_methods(module.tree)
        else:
            reads |= module.scope(module.tree.body, {})
    todo = list(reads)
    while todo:  # a property read outside reads what its body reads
        for pair in methods.get(todo.pop(), ()):
            if pair not in reads:
                reads.add(pair)
                todo.append(pair)
    return frozenset(reads)


def unread_keys() -> list[str]:
    return [key for key, chain in sorted(leaf_keys().items()) if not set(chain) <= read_pairs()]


def _allowed(key: str) -> str | None:
    """The allowlist entry (a key, or a section standing for its keys) that excuses ``key``."""
    return next((entry for entry in UNREAD if key == entry or key.startswith(entry + ".")), None)


def test_every_documented_key_is_read():
    unread = [key for key in unread_keys() if _allowed(key) is None]
    assert unread == [], (
        "documented recipe keys that no code outside hetrl.config reads (wire them, remove them, or type "
        f"their reader so that this test sees it: see its docstring): {unread}"
    )


def test_allowlist_entries_are_still_unread():
    excusing = {_allowed(key) for key in unread_keys()}
    stale = sorted(set(UNREAD) - excusing)
    assert stale == [], f"read now: remove from the allowlist: {stale}"


def test_reads_are_typed_by_section():
    """A pool's ``self.config.workers`` reads ``SandboxConfig.workers``, not ``RewardConfig.workers``;
    ``cfg.reward`` reaches the reward section, and a loop over its functions their class."""
    source = """
from hetrl.config.reward import SandboxConfig
from hetrl.config.schema import HetrlConfig

class Pool:
    def __init__(self, config: SandboxConfig) -> None:
        self.config = config

    def size(self) -> int:
        return self.config.workers

def weights(cfg: HetrlConfig) -> list[float]:
    reward = cfg.reward
    return [f.weight for f in reward.functions]
"""
    tree = ast.parse(source)
    reads = _Module(tree, {}).scope(tree.body, {})
    assert {
        ("SandboxConfig", "workers"),
        ("HetrlConfig", "reward"),
        ("RewardConfig", "functions"),
        ("RewardFunctionConfig", "weight"),
    } <= reads
    assert ("RewardConfig", "workers") not in reads and ("RewardConfig", "sandbox") not in reads
