"""Attention heatmaps (PNG, matplotlib Agg) from the weights the model itself keeps.

A `MultiHeadAttention` whose `keep_weights` is set keeps its last call's weights `[batch,
heads, q_len, kv_len]` in `attention_weights` (reference attention path). `collect_attention`
sets it on every attention module of the unrolled model, runs a teacher-forced forward pass and
returns the weights by name:

    maps = collect_attention(module, inputs, targets)   # encoder-decoder
    maps = collect_attention(module, None, tokens)      # decoder-only
    # {'encoder/layer_0/self_attention': [batch, heads, src, src],
    #  'decoder/layer_0/self_attention': [batch, heads, tgt, tgt],
    #  'decoder/layer_0/cross_attention': [batch, heads, tgt, src], ...}

`save_sentence_plots` then writes one PNG per attention module, layer and head plus the
head average, with the sub-word pieces on the axes: rows are the target tokens being
predicted (queries), columns the source tokens (cross-attention) or the decoder inputs
(`<s>` then the previous target tokens; decoder self-attention).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import os
import re
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from autoregressive.decodable import decoding_model
from common.atomic_file import OutputError, make_output_dir, write_output
from common.errors import carried
from inference.streaming import InputError
from model.build import bind
from model.kinds import adapter_of
from model.layers import MultiHeadAttention

START_LABEL = '<s>'


def module_name(path) -> str:
  """An attention module's name in the plots: its path in the model, a layer `layers/3` named
  `layer_3` (the file names decode.py has always written)."""
  parts, names = list(path), []
  for i, part in enumerate(parts):
    if isinstance(part, int) and i and parts[i - 1] == 'layers':
      names[-1] = f'layer_{part}'
    else:
      names.append(str(part))
  return '/'.join(names)


@functools.partial(jax.jit, static_argnums=0)
def _forward_with_weights(config, params, inputs, targets) -> dict[str, jax.Array]:
  """The teacher-forced pass of the (unrolled) model of `config` holding `params` -> every
  attention module's weights `[batch, heads, q, k]` by `module_name`."""
  model = bind(config, params)  # a fresh module in this trace: setting attributes is fine
  attentions = {module_name(path): m for path, m in nnx.iter_modules(model)
                if isinstance(m, MultiHeadAttention)}
  for m in attentions.values():
    m.keep_weights = True
  adapter_of(config).teacher_forced(model, inputs, targets)
  return {name: m.attention_weights[...] for name, m in attentions.items()}


def collect_attention(module, inputs, targets) -> dict[str, np.ndarray]:
  """Teacher-forced forward pass -> attention weights by module name, `[batch, heads, q, k]`
  float32 (`module`: an NNX model).

  `inputs` `[batch, src_len]` (None for a decoder-only model) and `targets`
  `[batch, tgt_len]` (for a decoder-only model, the tokens), right-padded with 0.
  """
  config, params = decoding_model(module)  # unrolled: weights are kept per layer
  # The reference attention path is the one that returns the weights.
  config = dataclasses.replace(config, attention_impl='reference', remat=False)
  inputs = None if inputs is None else jnp.asarray(inputs, jnp.int32)
  weights = _forward_with_weights(config, params, inputs, jnp.asarray(targets, jnp.int32))
  return {name: np.asarray(w, np.float32) for name, w in weights.items()}


def _layer_sort_key(name: str):
  return [int(p) if p.isdigit() else p for p in re.split(r'(\d+)', name)]


def _safe(text: str) -> str:
  return re.sub(r'[^A-Za-z0-9_.-]+', '_', text).strip('_')


def _figure(width: float, height: float, dpi: int):
  """A matplotlib Figure drawn by Agg, without pyplot (no global figure list, no GUI)."""
  from matplotlib import figure  # pylint: disable=import-outside-toplevel
  from matplotlib.backends import backend_agg  # pylint: disable=import-outside-toplevel
  fig = figure.Figure(figsize=(width, height), dpi=dpi)
  backend_agg.FigureCanvasAgg(fig)
  return fig


def _write_png(fig, path: str) -> str:
  """The figure's current Agg buffer as a PNG (fast zlib level: these are throwaway plots),
  written as every output is (`common.atomic_file`: no symlink or workdir file, whole or not at
  all; not fsynced: hundreds of throwaway files), a failure one `InputError` line."""
  from PIL import Image  # pylint: disable=import-outside-toplevel  # what matplotlib writes with
  png = io.BytesIO()
  Image.fromarray(np.asarray(fig.canvas.buffer_rgba())[..., :3]).save(png, format='PNG',
                                                                      compress_level=1)
  try:
    write_output(path, png.getvalue(), what='attention plot', sync=False)
  except OutputError as e:
    raise carried(InputError(str(e)), e) from None
  return path


def _make_dir(path: str) -> None:
  """`path` created (not inside a workdir's own folders), a failure one `InputError` line."""
  try:
    make_output_dir(path, what='attention plot directory')
  except OutputError as e:
    raise carried(InputError(str(e)), e) from None


class _Heatmap:
  """One labelled heatmap figure; `save` redraws it with new weights.

  The axes, tick labels (the sub-word pieces) and layout are drawn once per attention module:
  they are most of matplotlib's time. Each head then only redraws what changes (the image, the
  title and the colorbar, "animated" artists blitted over a copy of the rest) and writes the
  buffer, about 10x faster than a `savefig` per head.
  """

  def __init__(self, rows: Sequence[str], cols: Sequence[str], *, xlabel: str, ylabel: str):
    self.fig = _figure(min(30.0, 2.5 + 0.32 * len(cols)), min(30.0, 1.8 + 0.30 * len(rows)), 100)
    ax = self.fig.add_subplot()
    self.image = ax.imshow(np.zeros((len(rows), len(cols))), cmap='viridis', vmin=0.0, vmax=1.0,
                           aspect='auto', interpolation='nearest')
    ax.set_xticks(range(len(cols)))
    ax.set_xticklabels(list(cols), rotation=90, fontsize=8)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(list(rows), fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    self.title = ax.set_title(' ', fontsize=9)
    self.colorbar = self.fig.colorbar(self.image, ax=ax, fraction=0.046, pad=0.04)
    self.fig.tight_layout()
    self.changing = (self.image, self.title, self.colorbar.ax)
    for artist in self.changing:
      artist.set_animated(True)
    self.fig.canvas.draw()
    self.background = self.fig.canvas.copy_from_bbox(self.fig.bbox)

  def save(self, weights: np.ndarray, title: str, path: str) -> str:
    self.image.set_data(weights)
    self.image.set_clim(0.0, max(float(weights.max()), 1e-6))
    self.title.set_text(title)
    self.fig.canvas.restore_region(self.background)
    for artist in self.changing:
      self.fig.draw_artist(artist)
    return _write_png(self.fig, path)

  def close(self):
    self.fig.clear()


def _panels(maps, index, source_pieces, target_pieces):
  """(name, weights `[heads, rows, cols]`, row labels, col labels, xlabel, ylabel) of every
  attention module of sentence `index`, in layer order, cut to the sentence's lengths."""
  tgt = list(target_pieces)
  decoder_inputs = [START_LABEL] + tgt[:-1]
  encoder_first = lambda name: (not name.startswith('encoder'), _layer_sort_key(name))  # noqa: E731
  for name in sorted(maps, key=encoder_first):
    if source_pieces is None and (name.startswith('encoder') or name.endswith('cross_attention')):
      continue
    if name.startswith('encoder'):
      rows = cols = list(source_pieces)
      xlabel, ylabel = 'source (keys)', 'source (queries)'
    elif name.endswith('cross_attention'):
      rows, cols = tgt, list(source_pieces)
      xlabel, ylabel = 'source', 'target (predicted token)'
    else:
      rows, cols = tgt, decoder_inputs
      xlabel, ylabel = 'decoder input (previous tokens)', 'target (predicted token)'
    yield name, maps[name][index][:, :len(rows), :len(cols)], rows, cols, xlabel, ylabel


_LABEL_INCHES = 0.11  # per token on an axis: 6-point labels stay legible
_CHAR_INCHES = 0.055  # per character of a 6-point label


def save_overview(panels, title: str, path: str) -> str:
  """One PNG of a sentence's attention: a row per attention module (each layer's self and cross), a
  column per head after the heads' average. The average's axes carry the tokens (queries on
  the left, keys below) and the module's name; the heads beside it share them. The file to
  open first."""
  fig = _overview_figure(panels, title)
  fig.canvas.draw()
  return _write_png(fig, path)


def _overview_figure(panels, title: str):
  """The overview's Figure (laid out by hand: tight_layout over dozens of axes is slow)."""
  heads = max(p[1].shape[0] for p in panels)
  longest = lambda labels: max((len(str(x)) for x in labels), default=1)  # noqa: E731
  cell_w = max(1.6, _LABEL_INCHES * max(len(p[3]) for p in panels))
  cell_h = max(1.3, _LABEL_INCHES * max(len(p[2]) for p in panels))
  below = 0.25 + _CHAR_INCHES * max(longest(p[3]) for p in panels)  # rotated key labels
  left = 0.5 + _CHAR_INCHES * max(longest(p[2]) for p in panels)  # name + query labels
  gap, top = 0.15, 0.8
  width = left + (heads + 1) * cell_w + heads * gap + 0.2
  height = top + len(panels) * (cell_h + below)
  fig = _figure(width, height, 100)
  fig.subplots_adjust(left=left / width, right=1 - 0.2 / width, top=1 - top / height,
                      bottom=below / height, wspace=gap / cell_w, hspace=below / cell_h)
  axes = fig.subplots(len(panels), heads + 1, squeeze=False)
  for r, (name, weights, rows, cols, *_) in enumerate(panels):
    columns = [('average', weights.mean(axis=0))]
    columns += [(f'head {h}', weights[h]) for h in range(weights.shape[0])]
    for c, ax in enumerate(axes[r]):
      ax.set_xticks([])
      ax.set_yticks([])
      if c >= len(columns):
        ax.axis('off')
        continue
      label, w = columns[c]
      ax.imshow(w, cmap='viridis', vmin=0.0, vmax=max(float(w.max()), 1e-6), aspect='auto',
                interpolation='nearest')
      if r == 0:
        ax.set_title(label, fontsize=9)
    first = axes[r][0]
    first.set_xticks(range(len(cols)), list(cols), rotation=90, fontsize=6)
    first.set_yticks(range(len(rows)), list(rows), fontsize=6)
    first.set_ylabel(name.replace('/', '\n'), fontsize=7)
  fig.suptitle(title, fontsize=10, y=1 - 0.15 / height, va='top')
  return fig


def save_sentence_plots(maps: dict[str, np.ndarray], index: int, out_dir: str, *,
                        source_pieces: Sequence[str] | None, target_pieces: Sequence[str],
                        heads: str = 'all', folder: str | None = None,
                        title: str | None = None) -> list[str]:
  """PNG heatmaps of one sentence (row `index` of every map) into `out_dir/<folder>/`:
  `overview.png` (every module and head in one grid), then one labelled file per attention
  module and head plus the head average.

  `folder` defaults to `sentence_NNNN` (the index), `title` to `sentence N`.

  `source_pieces`: the source sub-words (None for a decoder-only model); `target_pieces`:
  the target sub-words (the decoder's predictions, EOS included). Weights are cut to these
  lengths (the batch was padded). `heads='all'` writes every head and the average,
  `'average'` only the average. Returns the written paths.
  """
  directory = os.path.join(out_dir, folder or f'sentence_{index:04d}')
  title = title or f'sentence {index}'
  _make_dir(directory)
  panels = list(_panels(maps, index, source_pieces, target_pieces))
  written = [save_overview(panels, title, os.path.join(directory, 'overview.png'))]
  for name, weights, rows, cols, xlabel, ylabel in panels:
    base = _safe(name.replace('/', '_'))
    figures = [('average', weights.mean(axis=0))]
    if heads == 'all':
      figures += [(f'head_{h}', weights[h]) for h in range(weights.shape[0])]
    figure = _Heatmap(rows, cols, xlabel=xlabel, ylabel=ylabel)
    try:
      for label, w in figures:
        path = os.path.join(directory, f'{base}_{label}.png')
        text = f'{title}: {name} ({label.replace("_", " ")})'
        written.append(figure.save(w, text, path))
    finally:
      figure.close()
  return written


def plot_lines(module, piece, items, out_dir: str, *, heads: str = 'all',
               progress: Callable[[int], None] | None = None) -> int:
  """Attention heatmaps of `items`, `(index, source ids or None, output ids)` each, teacher-forced
  on the output ids (a decoder-only model takes no source). `piece(id)` labels the axes; item
  `index` goes to `out_dir/line_<index+1>/`; `progress(1)` after each sentence. Returns the
  number of PNGs. `module`: an NNX model."""
  module = decoding_model(module)  # split once for every batch
  has_source = adapter_of(module).has_source
  _make_dir(out_dir)
  bucket = lambda n: -(-max(n, 1) // 16) * 16  # noqa: E731  (few padded shapes: few compilations)
  written = 0
  for start in range(0, len(items), 8):
    batch = items[start:start + 8]
    targets = np.zeros((len(batch), bucket(max(len(o) for _, _, o in batch))), np.int32)
    inputs = None
    if has_source:
      inputs = np.zeros((len(batch), bucket(max(len(s) for _, s, _ in batch))), np.int32)
    for row, (_, source, output) in enumerate(batch):
      targets[row, :len(output)] = output
      if has_source:
        inputs[row, :len(source)] = source
    maps = collect_attention(module, inputs, targets)
    for row, (index, source, output) in enumerate(batch):
      written += len(save_sentence_plots(
          maps, row, out_dir, source_pieces=[piece(t) for t in source] if has_source else None,
          target_pieces=[piece(t) for t in output], heads=heads, folder=f'line_{index + 1:05d}',
          title=f'line {index + 1}'))
      if progress is not None:
        progress(1)
  return written
