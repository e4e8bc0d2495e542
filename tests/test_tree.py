import pytest
import torch

from methods.tree import Tree, TreeError, load_template


def test_derivations_worked_example():
    #     0
    #    / \
    #   1   2
    #   |
    #   3
    t = Tree.from_parents([-1, 0, 0, 1])
    assert t.depth.tolist() == [0, 1, 1, 2]
    assert t.max_depth == 2
    assert t.ancestors.int().tolist() == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 0, 1, 0],
        [1, 1, 0, 1],
    ]
    assert t.leaf_paths() == [[0, 2], [0, 1, 3]]
    assert t.path_to(3) == [0, 1, 3]
    assert t.children_counts() == [2, 1, 0, 0]
    assert t.parent_index.tolist() == [0, 0, 0, 1]
    assert not t.is_chain


def test_chain_and_root_only():
    assert Tree.chain(1).parents == (-1,)
    assert Tree.chain(1).is_chain and Tree.chain(4).is_chain
    assert Tree.chain(4).parents == (-1, 0, 1, 2)
    assert Tree.chain(4).leaf_paths() == [[0, 1, 2, 3]]


def test_derived_once_per_topology():
    assert Tree.from_parents((-1, 0, 0)) is Tree.from_parents([-1, 0, 0])


def test_children_counts_round_trip():
    t = Tree.from_children_counts([3, 2, 1, 0, 1, 0, 0, 0])
    assert t.parents == (-1, 0, 0, 0, 1, 1, 2, 4)
    assert t.children_counts() == [3, 2, 1, 0, 1, 0, 0, 0]


@pytest.mark.parametrize("parents, message", [
    ([], "root"),
    ([0, 0], "root"),
    ([-1, 1], "parent 1"),
    ([-1, 0, 2], "parent 2"),
    ([-1, 0, 1, 0], "breadth-first"),   # depth 1 after depth 2
    ([-1, 0, 0, 2, 1], "breadth-first"),  # siblings out of parent order
])
def test_invalid_trees_are_refused(parents, message):
    with pytest.raises(TreeError, match=message):
        Tree.from_parents(parents)


def test_children_counts_that_do_not_add_up():
    with pytest.raises(TreeError):
        Tree.from_children_counts([1, 0, 0])  # 2 nodes, 3 counts
    with pytest.raises(TreeError):
        Tree.from_children_counts([0, 1])  # node 1 never exists


def test_ranks():
    t = Tree.from_children_counts([3, 2, 1])
    assert t.rank.tolist() == [0, 0, 1, 2, 0, 1, 0]


def test_paper_template():
    t = load_template("paper")
    assert t.size == 81 and t.max_depth == 6
    per_depth = torch.bincount(t.depth).tolist()
    assert per_depth == [1, 8, 21, 25, 15, 8, 3]
    assert len(t.leaf_paths()) == 40
    assert max(t.children_counts()) == 8


def test_unknown_template_lists_known():
    with pytest.raises(TreeError, match="no tree template 'papr'; known: .*paper"):
        load_template("papr")


def test_to_device_keeps_topology():
    t = Tree.from_parents([-1, 0, 0, 1]).to(torch.device("cpu"))
    assert t.parents == (-1, 0, 0, 1)
