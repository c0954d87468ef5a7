"""The model as decoding takes it: `decoding_model`, the one place a `scan_layers` model is
unrolled and an NNX module split into the (config, params) that the jitted programs take. A
public name of the decoding room: the searches, scoring, `Session`, a workdir's restore and the
attention plots all decode or plot through it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from model.build import params_of, unrolled
from model.config import ModelConfig


class Decodable(NamedTuple):
  """A model as the decoding programs take it: `config` (static: a program is compiled per
  config) and `params` (the pure dict of its parameters, traced), unrolled. Callers that decode
  many batches (a `Session`) keep this form, so that the module is split once; it never
  appears in a public signature (the NNX model is the one public form)."""
  config: ModelConfig
  params: dict[str, Any]


def decoding_model(model) -> Decodable:
  """The (config, params) to decode or plot with, of an NNX model (`model.build_model`) or of a
  `Decodable` (returned as it is). A `scan_layers` model runs unrolled, so that every layer has
  its own KV cache and its own kept attention weights (same weights, same results). Every
  inference path goes through here. Internal: the public functions take the NNX model; a
  `Session` splits once and passes its split down (a split costs ~10 ms), where the decoding
  functions' own call is then a no-op."""
  if isinstance(model, Decodable):
    return model
  model = unrolled(model)
  return Decodable(model.config, params_of(model))
