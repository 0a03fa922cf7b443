"""The package's modules import one another without a circle, so each can be read (and imported)
above the ones it uses: errors.py, the exception types, imports nothing of ours; cli.run_main,
the entry points' error handler, sits above fileio and flags."""
import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "mlperf_bert"


def _module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path, top_level_only):
    """The mlperf_bert modules ``path`` imports (at module level, or anywhere)."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = list(ast.walk(tree))
    if top_level_only:  # module level includes if/try/with blocks, not function or class bodies
        nodes, todo = [], list(tree.body)
        while todo:
            node = todo.pop()
            nodes.append(node)
            if isinstance(node, (ast.If, ast.Try, ast.With)):
                todo += [n for n in ast.iter_child_nodes(node) if isinstance(n, ast.stmt)]
                for h in getattr(node, "handlers", []):
                    todo += h.body
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            # ``from mlperf_bert.trainer import loader`` imports the module mlperf_bert.trainer.loader
            found |= {base + "." + a.name for a in node.names} | {base}
    return found


def _graph(top_level_only):
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: sorted(m for m in _imports(path, top_level_only) if m in paths and m != name)
            for name, path in paths.items()}


def _cycle(graph):
    """A list of modules that import each other in a circle, or None."""
    state = {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, stack)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


def test_no_import_cycle_at_module_level():
    graph = _graph(top_level_only=True)
    assert len(graph) > 30 and "mlperf_bert.trainer.preflight" in graph["mlperf_bert.trainer.training"]
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_no_import_cycle_counting_imports_inside_functions():
    """Issue 48: model imported levers (for fp8_stacked) and levers imported model inside its
    functions, a circle the module-level walk did not see. A function-level import defers loading,
    not layering: the layers hold for every import."""
    graph = _graph(top_level_only=False)
    assert "mlperf_bert.trainer.model" in graph["mlperf_bert.trainer.levers"]
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_errors_imports_nothing_of_ours_and_run_main_sits_above():
    everywhere = _graph(top_level_only=False)
    assert everywhere["mlperf_bert.errors"] == []
    assert {"mlperf_bert.errors", "mlperf_bert.fileio", "mlperf_bert.flags"} <= set(everywhere["mlperf_bert.cli"])
    for low in ("mlperf_bert.errors", "mlperf_bert.fileio", "mlperf_bert.flags"):
        assert "mlperf_bert.cli" not in everywhere[low], low


def test_a_cycle_is_found():
    """The walk itself: a circle of three, as errors -> fileio -> flags -> errors was, is reported."""
    assert _cycle({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == ["a", "b", "c", "a"]
    assert _cycle({"a": ["b"], "b": ["c"], "c": [], "d": ["a", "c"]}) is None
