"""A `yaml.SafeLoader` that bounds how far YAML aliases expand.

An alias (``*name``) stands for the whole node its anchor (``&name``) marks, so nine aliases of a list of nine
aliases of ... (the "billion laughs" pattern) load as a few hundred bytes that expand to billions of values;
PyYAML shares the node, but every later walk of the recipe (checks, deep copies, ``config.yaml``,
``results.json``) writes it all out. This loader counts, while composing, how many nodes the aliases of one
document stand for once written out, and stops past `MAX_ALIAS_NODES`.

>>> yaml.load("a: &x [1, 2]\\nb: *x", Loader=BoundedAliasLoader)
{'a': [1, 2], 'b': [1, 2]}
"""

from __future__ import annotations

import yaml

# Recipes use an anchor for a head or an option block (tens of nodes, a few times); a bomb needs millions.
MAX_ALIAS_NODES = 10_000


class AliasLimitError(ValueError):
    """YAML aliases that expand past `MAX_ALIAS_NODES` nodes, or an alias inside the node it refers to."""

    def __init__(self, anchor: str, line: int, limit: int, recursive: bool = False) -> None:
        if recursive:
            message = (f"alias *{anchor} at line {line} refers to the node it is part of, which expands without "
                       "end; write the value out instead of the alias")
        else:
            message = (f"its YAML aliases stand for more than {limit:,} values once expanded (the limit is "
                       f"reached at alias *{anchor} on line {line}), the pattern of an alias bomb; a recipe needs "
                       "far fewer, so write the repeated values out or nest fewer aliases")
        super().__init__(message)
        self.anchor, self.line = anchor, line


class BoundedAliasLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` whose aliases may stand for at most `max_alias_nodes` nodes in all, per document."""

    max_alias_nodes = MAX_ALIAS_NODES

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._alias_nodes = 0
        self._sizes: dict[int, int] = {}  # id(node) -> its node count with every alias in it written out

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            node = self.anchors.get(event.anchor)
            if node is not None:  # an undefined alias: the composer says so itself
                line = event.start_mark.line + 1
                self._alias_nodes += self._expanded_size(node, event.anchor, line)
                if self._alias_nodes > self.max_alias_nodes:
                    raise AliasLimitError(event.anchor, line, self.max_alias_nodes)
        return super().compose_node(parent, index)

    def _expanded_size(self, node: yaml.Node, anchor: str, line: int) -> int:
        known = self._sizes.get(id(node))
        if known is not None:
            return known
        if isinstance(node, yaml.ScalarNode):
            return 1
        if node.end_mark is None:  # still being composed: the alias sits inside its own anchored node
            raise AliasLimitError(anchor, line, self.max_alias_nodes, recursive=True)
        children = node.value if isinstance(node, yaml.SequenceNode) else [n for pair in node.value for n in pair]
        size = 1
        for child in children:
            size += self._expanded_size(child, anchor, line)
            if size > self.max_alias_nodes:
                break  # already past the limit; the exact size does not matter
        self._sizes[id(node)] = size
        return size
