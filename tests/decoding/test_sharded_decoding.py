"""Decoding with sharded parameters: greedy, sampling and beam search with the
parameters sharded over a `(data, fsdp, tensor)` mesh of 8 simulated CPU devices give the
tokens of 1 device, and `decode.py --mesh` decodes a checkpoint trained on another mesh as
1 device does.

One 8-device subprocess (`python -m tests.decoding.test_sharded_decoding OUT`) trains the checkpoint
on mesh (2, 4, 1) and then decodes the tiny models on every mesh of MESHES (results in
OUT/tokens.npz), while the test process computes the 1-device reference: in process where it
has one CPU device, else (several devices, or an accelerator: the subprocesses run on CPU) in
a 1-device CPU subprocess (`... OUT --reference`, OUT/one.npz), so that both sides run on
the same backend on any host.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest

from tests.training import test_train_synthetic as syn

MESHES = ((1, 2, 4),)  # (data, fsdp, tensor): heads, d_ff and vocab over 4 devices, embed over 2
KINDS = ('encoder_decoder', 'decoder_only')
SEED = 3
# The decode.py checkpoint: trained on 8 devices as (data=2, fsdp=4); 4 heads, for tensor=4.
# data.tokenizer='char': the kind of the character tokenizer saved for decode.py (checked).
TRAIN = {'mesh.data': 2, 'mesh.fsdp': 4, 'model.num_heads': 4, 'train.num_steps': 2,
         'train.checkpoint_every_steps': 2, 'train.log_every_steps': 2,
         'train.num_eval_batches': 1, 'data.tokenizer': 'char'}
SENTENCES = b'abcdef\nhello\n\nzyx\n'


def _model(kind: str):
  """(config, params) of a tiny model (4 heads: split over 'tensor') with weights x2: peakier
  distributions than the near-uniform init, so that float reduction order cannot flip a
  choice."""
  import jax  # pylint: disable=import-outside-toplevel

  from model.build import as_config  # pylint: disable=import-outside-toplevel
  from training import state  # pylint: disable=import-outside-toplevel
  config = as_config(syn.tiny_config(kind, **{'model.num_heads': 4}).model)
  params = state.init_params(config, jax.random.PRNGKey(SEED))
  return config, jax.tree.map(lambda x: x * 2.0, params)


def _inputs(kind: str) -> np.ndarray:
  """Sources (EOS-terminated) or prompts (one empty) `[4, len]` of different lengths."""
  rng = np.random.default_rng(0)
  rows = np.zeros((4, 7 if kind == 'encoder_decoder' else 4), np.int32)
  for i, n in enumerate((6, 2, 4, 1) if kind == 'encoder_decoder' else (3, 0, 1, 4)):
    rows[i, :n] = rng.integers(3, syn.VOCAB, n)
    if kind == 'encoder_decoder':
      rows[i, n - 1] = 1
  return rows


def decode_all(mesh=None) -> dict[str, np.ndarray]:
  """Greedy and beam search (encoder-decoder), greedy and sampling (decoder-only), with the
  parameters laid out on `mesh` as training lays them out (None: one device) -> name ->
  tokens `[batch, (beam,) max_len]` or beam scores `[batch, beam]`."""
  import jax  # pylint: disable=import-outside-toplevel

  from autoregressive.strategies.beam import beam_search_decode  # pylint: disable=import-outside-toplevel
  from autoregressive.strategies.greedy import greedy_decode  # pylint: disable=import-outside-toplevel
  from autoregressive.strategies.sampling import sample  # pylint: disable=import-outside-toplevel
  from model import bind  # pylint: disable=import-outside-toplevel
  from training import mesh as mesh_lib, state  # pylint: disable=import-outside-toplevel
  out = {}
  for kind in KINDS:
    config, params = _model(kind)
    if mesh is not None:
      params = jax.device_put(params, state.param_shardings(config, mesh, mesh_lib.rules()))
      # How finely the parameters are split: fsdp x tensor for the largest ones.
      out[f'{kind}/most_shards'] = max(x.size // x.addressable_shards[0].data.size
                                       for x in jax.tree.leaves(params))
    module = bind(config, params)  # the model holding the (sharded) parameters
    x = _inputs(kind)
    given = {'inputs': x} if kind == 'encoder_decoder' else {'prompt': x}
    out[f'{kind}/greedy'] = greedy_decode(module, **given, max_new_tokens=8)
    if kind == 'encoder_decoder':
      out[f'{kind}/beam'], out[f'{kind}/beam_scores'] = beam_search_decode(
          module, **given, beam_size=3, alpha=0.6, max_new_tokens=8)
    else:
      out[f'{kind}/sample'] = sample(module, **given, max_new_tokens=8, top_k=12,
                                     rng=jax.random.PRNGKey(1), temperature=0.9)
  return {k: np.asarray(v) for k, v in out.items()}


def main(out_dir: str, reference: bool = False) -> None:
  """On 8 devices: trains OUT/workdir on mesh (2, 4, 1) (with a character tokenizer for
  decode.py), then decodes on every mesh of MESHES -> OUT/tokens.npz. `reference`: on this
  process's one device instead -> OUT/one.npz."""
  from input_pipeline import tokenizers  # pylint: disable=import-outside-toplevel
  from model import partitioning  # pylint: disable=import-outside-toplevel
  syn.enable_compilation_cache()
  if reference:
    np.savez(os.path.join(out_dir, 'one.npz'), **decode_all())
    return
  workdir = os.path.join(out_dir, 'workdir')
  syn.run(workdir, 'encoder_decoder', TRAIN)
  tokenizers.CharTokenizer(list(syn.ALPHABET)).save(os.path.join(workdir, 'tokenizer'))
  arrays = {}
  for shape in MESHES:
    mesh = partitioning.device_mesh(shape)
    arrays.update({f'{shape}/{k}': v for k, v in decode_all(mesh).items()})
  np.savez(os.path.join(out_dir, 'tokens.npz'), **arrays)


# ----------------------------------------------------------------------------- tests

compilation_cache = pytest.fixture(scope='module', autouse=True)(syn.compilation_cache_fixture)


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """(OUT of the 8-device subprocess, the 1-device reference of `decode_all`)."""
  import jax  # pylint: disable=import-outside-toplevel
  out = tmp_path_factory.mktemp('sharded_decoding')

  def start(*args, devices):
    return subprocess.Popen([sys.executable, '-m', __name__, str(out), *args],
                            env=syn.subprocess_env(devices), cwd=syn.REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  procs = [start(devices=8)]
  in_process = jax.device_count() == 1 and jax.default_backend() == 'cpu'
  try:
    if in_process:
      one = decode_all()  # meanwhile, on this process's one device
    else:
      procs.append(start('--reference', devices=1))
    logs = [p.communicate()[0] for p in procs]
  finally:
    for p in procs:
      p.kill()
  for p, text in zip(procs, logs, strict=True):
    assert p.returncode == 0, text[-4000:]
  log = logs[0]
  if not in_process:
    one = syn.load_npz(str(out / 'one.npz'))
  assert 'mesh (data=2, fsdp=4, tensor=1) over 8 cpu device(s)' in log, log[-4000:]
  return out, one


def test_sharded_parameters_decode_the_tokens_of_one_device(runs):
  out, one = runs
  sharded = syn.load_npz(str(out / 'tokens.npz'))
  for shape in MESHES:
    for kind in KINDS:
      assert sharded[f'{shape}/{kind}/most_shards'] == 8, (shape, kind)
    for name, expected in one.items():
      got = sharded[f'{shape}/{name}']
      if name.endswith('scores'):
        np.testing.assert_allclose(got, expected, rtol=1e-5, err_msg=f'{shape} {name}')
      else:
        np.testing.assert_array_equal(got, expected, err_msg=f'{shape} {name}')
  # Not trivially equal: every row generated something, and the beams differ.
  for name in ('encoder_decoder/greedy', 'decoder_only/sample'):
    assert (one[name][:, 0] != 0).all(), name
  assert (one['encoder_decoder/beam'][:, 0] != one['encoder_decoder/beam'][:, 1]).any()


def _decode_py(*args, devices=1, stdin=SENTENCES):
  """`python decode.py ARGS` on `devices` CPU devices, sharing the tests' compilation cache."""
  return subprocess.Popen([sys.executable, os.path.join(syn.REPO, 'decode.py'), *args,
                           f'--compilation_cache={syn.CACHE_DIR}'],
                          env=syn.subprocess_env(devices), cwd=syn.REPO, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(procs, stdin=SENTENCES):
  """Feeds each process `stdin`; -> (returncode, stdout, stderr) per process."""
  return [(p.communicate(stdin.decode()), p.returncode)[::-1] for p in procs]


def test_decode_py_with_mesh_decodes_a_2x4x1_checkpoint_as_one_device(runs):
  workdir = str(runs[0] / 'workdir')
  args = (f'--workdir={workdir}', '--beam_size=3', '--max_new_tokens=8')
  one, sharded = _finish([_decode_py(*args), _decode_py(*args, '--mesh=1,2,4', devices=8)])
  assert one[0] == 0, one[1][1][-3000:]
  assert sharded[0] == 0, sharded[1][1][-3000:]
  assert 'onto mesh (data, fsdp, tensor)=(1, 2, 4)' in sharded[1][1]
  assert one[1][0].count('\n') == 4 and one[1][0].split('\n')[2] == ''
  assert sharded[1][0] == one[1][0]


# {n}: this process's devices; {more}: one more than those (a mesh they never fit).
@pytest.mark.parametrize('value,message', [
    ('1,1,{more}', ('--mesh=1,1,{more} does not fit the {n} device(s) here: DATA x FSDP x '
                    'TENSOR must be {n} (one size may be -1: the remaining devices)')),
    ('-1,-1,1', '--mesh=-1,-1,1 does not fit the {n} device(s) here'),
    ('2,x', ('--mesh=2,x must be three sizes DATA,FSDP,TENSOR (positive integers; one may be '
             '-1 = the remaining devices), e.g. 1,2,4')),
    ('1,0,1', '--mesh=1,0,1 must be three sizes'),
])
def test_bad_mesh_flag_is_one_line(value, message):
  import jax  # pylint: disable=import-outside-toplevel

  from workdir import restore  # pylint: disable=import-outside-toplevel
  n = jax.device_count()
  value, message = (s.format(n=n, more=n + 1) for s in (value, message))
  with pytest.raises(restore.RestoreError, match='^' + re.escape(message)):
    restore.mesh_from_flag(value)


def test_mesh_must_divide_heads_and_feed_forward(tmp_path):
  from workdir import restore  # pylint: disable=import-outside-toplevel
  config = syn.tiny_config('encoder_decoder', **{'model.num_heads': 4}).model
  eight = types.SimpleNamespace(shape={'data': 1, 'fsdp': 1, 'tensor': 8})
  with pytest.raises(restore.RestoreError, match=re.escape(
      f"the model in {tmp_path}/config.json has num_heads=4, not divisible by the mesh's tensor "
      'size 8')):
    restore.check_mesh(config, eight, str(tmp_path))
  restore.check_mesh(config, types.SimpleNamespace(shape={'tensor': 4}), str(tmp_path))


def test_decode_py_bad_mesh_is_one_line_and_exit_2(runs):
  proc = _decode_py(f'--workdir={runs[0] / "workdir"}', '--mesh=1,2,4')
  (code, (out, err)), = _finish([proc])
  assert code == 2 and out == '', err[-3000:]
  line = ('decode.py: error: --mesh=1,2,4 does not fit the 1 device(s) here: DATA x FSDP x '
          'TENSOR must be 1 (one size may be -1: the remaining devices)')
  assert err.strip().splitlines() == [line], err[-3000:]


if __name__ == '__main__':
  main(sys.argv[1], reference='--reference' in sys.argv[2:])
