"""Arctic Long Sequence Training's recipes for Llama-3.1-8B on H100 nodes
(data/alst_recipes.yaml): each configuration its authors ran at the length it names fits in
zerosim, and the 32-bit wall the one-GPU recipe stopped at."""

from __future__ import annotations

import zerosim
from zerosim.validation.alst_recipes import load_recipes


def test_the_recipes_are_arctic_trainings_on_the_alst_scenario():
    recipes = load_recipes()
    assert len(recipes.recipes) == 9
    by_name = {r.name: r for r in recipes.recipes}
    one_gpu = zerosim.load_scenario(recipes.scenario,
                                    recipes.overrides(by_name["run-h100-sp1-llama-8b"]))
    assert (one_gpu.data_parallel, one_gpu.sequence_length) == (1, 499_968)
    assert one_gpu.deepspeed.offload_param.device == "cpu" and one_gpu.runtime.liger_kernel
    node = zerosim.load_scenario(recipes.scenario,
                                 recipes.overrides(by_name["run-h100-sp8-llama-8b"]))
    assert node.deepspeed.sequence_parallel_size == 8 and node.runtime.checkpoint_in_cpu
    assert not node.deepspeed.offload_optimizer.pin_memory
    assert node.runtime.tiled_mlp_shards == "auto" and node.runtime.tiled_loss_shards is None
    four = zerosim.load_scenario(recipes.scenario,
                                 recipes.overrides(by_name["run-h100-sp32-llama-8b"]))
    assert (four.hardware.nodes, four.data_parallel) == (4, 32)


def test_every_recipe_fits_at_its_length(validation_cells):
    group = load_recipes().group
    cells = [c for c in validation_cells if c.group == group]
    assert len(cells) == 9 and {c.status for c in cells} == {"pass"}
    assert all(c.simulated_text.startswith("fits, ") for c in cells)


def test_the_one_gpu_recipes_wall_is_2_to_the_31_elements_of_a_ranks_hidden_states():
    """The recipe's 500K ran and 555K stopped in Liger-Kernel's RMSNorm (32-bit row offsets
    before 0.6.1): a rank's hidden states cross 2^31 elements between them, and a group of S
    GPUs moves that wall to S x 524,288 tokens, above the paper's 3.7M (S = 8) and 15M (32)."""
    hidden = 4096
    assert 500_000 * hidden < 2**31 < 555_000 * hidden
    assert [s * 2**31 // hidden for s in (1, 8, 16, 32)] == [524_288, 4_194_304, 8_388_608,
                                                              16_777_216]
