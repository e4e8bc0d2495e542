import torch
from transformers import DynamicCache, LlamaConfig

from methods.engine import kv


def _cache(n_slots: int) -> DynamicCache:
    """A 2-layer cache whose slot i holds the value i (keys) and -i (values) everywhere."""
    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=8, num_attention_heads=2, num_key_value_heads=2)
    cache = DynamicCache(config=cfg)
    slot = torch.arange(n_slots, dtype=torch.float32).view(1, 1, n_slots, 1).expand(1, 2, n_slots, 4)
    for layer in range(2):
        cache.update(slot.clone(), -slot.clone(), layer)
    return cache


def _slots(cache, layer=0):
    return cache.layers[layer].keys[0, 0, :, 0].int().tolist()


def test_commit_keeps_the_accepted_path_only():
    # cache [0..7 | 8 9 10], the tree's path is nodes [0, 2] -> [0..7 8 10]
    cache = _cache(11)
    kv.commit(cache, start=8, keep=[0, 2])
    assert kv.length(cache) == 10
    for layer in range(2):
        assert _slots(cache, layer) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 10]
        assert (-cache.layers[layer].values[0, 1, :, 2]).int().tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 10]


def test_commit_prefix_only_truncates():
    cache = _cache(11)
    kv.commit(cache, start=8, keep=[0, 1])
    assert _slots(cache) == list(range(10))


def test_commit_deep_path_then_grow():
    cache = _cache(14)  # [0..7 | 8 .. 13], path [0, 2, 3, 5]
    kv.commit(cache, start=8, keep=[0, 2, 3, 5])
    assert _slots(cache) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 13]
    new = torch.full((1, 2, 1, 4), 99.0)
    for layer in range(2):
        cache.update(new, -new, layer)
    assert _slots(cache)[-2:] == [13, 99]
