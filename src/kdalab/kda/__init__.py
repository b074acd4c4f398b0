"""KDA numerics: the input stage (gate, β, normalization), the fp64 recurrent reference, the
intra-chunk L and its inverses, tile scaling, precision recipes, and the one chunked forward."""

from kdalab.kda.chunk import chunk_core, forward, forward_prepared, prepare_for_recipe
from kdalab.kda.gate import GATES, beta_activation, l2_normalize, log_decay, prepare_inputs
from kdalab.kda.inverse import INVERSES
from kdalab.kda.naive import recurrent_core, recurrent_kda, reference_forward
from kdalab.kda.recipe import RECIPES, Recipe, get_recipe
from kdalab.kda.tiles import TILES, TileScaling, get_tiles

__all__ = ["forward", "forward_prepared", "chunk_core", "prepare_for_recipe", "GATES",
           "beta_activation", "l2_normalize", "log_decay", "prepare_inputs", "INVERSES",
           "recurrent_kda", "recurrent_core", "reference_forward", "RECIPES", "Recipe",
           "get_recipe", "TILES", "TileScaling", "get_tiles"]
