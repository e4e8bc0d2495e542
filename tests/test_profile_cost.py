"""scripts.profile_cost on a tiny random Llama: the shape of the curve and its figure."""
import pytest

from methods.autotree import measure_cost, star
from methods.engine import HFEngine, StaticEngine
from scripts.profile_cost import plot


def test_star_trees():
    assert star(1).parents == (-1,) and star(4).parents == (-1, 0, 0, 0)


@pytest.mark.parametrize("engine", [HFEngine, StaticEngine])
def test_cost_curve(tiny_model, tmp_path, engine):
    rows = measure_cost(engine(tiny_model), sizes=[1, 4, 16], contexts=[8, 32], repeats=2)
    assert [(r["context"], r["tokens"]) for r in rows] == [(8, 1), (8, 4), (8, 16), (32, 1), (32, 4), (32, 16)]
    assert all(r["ms"] > 0 and r["ms_min"] <= r["ms"] for r in rows)
    assert [r["vs_plain"] for r in rows if r["tokens"] == 1] == [1.0, 1.0]
    plot(rows, tmp_path, "tiny", "cpu")
    assert (tmp_path / "cost.png").stat().st_size > 5000 and (tmp_path / "cost.pdf").is_file()
