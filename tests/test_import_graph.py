"""The import graph of `rankwise` has no cycles: for every direct import a -> b, nothing imported by b leads back to a.

Imports inside functions count (grimp reads them all), so a cycle cannot hide behind a lazy import. The layer
contract itself is `lint-imports` (pyproject.toml); this test keeps modules within a layer acyclic too.
"""

import grimp


def test_no_import_cycles():
    graph = grimp.build_graph("rankwise", cache_dir=None)
    cycles = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back:
                cycles.append(f"{importer} -> {' -> '.join(back)}")
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
