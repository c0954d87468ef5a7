"""bench/decode_engines.py runs end to end on a tiny trained workdir and a few test2016 lines:
every engine in its own subprocess, CTranslate2 float32 identical to ours but where a measured
near-tie decides (`beam_reference`), the report's figures present (no timing assertions)."""

import json
import os

from bench import decode_engines
from tests import beam_reference, export_workdirs, extras

extras.require('ctranslate2')
extras.require('transformers')


def test_bench_runs_every_engine_and_checks_outputs(tmp_path_factory, capsys):
  workdir = export_workdirs.trained(tmp_path_factory, 'mt')
  before = sorted(os.listdir(workdir))
  outputs_dir = tmp_path_factory.mktemp('engines')
  decode_engines.main([f'--workdir={workdir}', '--lines=5', '--beam_sizes=2', '--repeats=1',
                       '--warm_passes=1', '--max_new_tokens=16', '--batch_size=4',
                       f'--outputs_dir={outputs_dir}'])
  out, err = capsys.readouterr()
  report = json.loads(out.strip().splitlines()[-1])
  assert report['sentences'] == 5 and report['max_new_tokens'] == 16
  results = report['results']['2']
  assert set(results) == set(decode_engines.ENGINES)
  for name, r in results.items():
    assert r['tokens'] > 0 and r['warm_tok_s'] > 0 and r['peak_rss_mb'] > 0, name
    assert r['cold_s'] > 0 and len(r['repeats']) == 1, name
  # The same computation: the same tokens, but where float rounding decides a near-tie
  # (another CPU's arithmetic may break it the other way).
  with open(outputs_dir / 'outputs.json', encoding='utf-8') as f:
    found = json.load(f)
  ours, theirs = found['outputs']['2']['ours'], found['outputs']['2']['ct2_float32']
  import inference  # pylint: disable=import-outside-toplevel
  module = inference.load(workdir).module

  def reference(i):
    search = beam_reference.model_next_log_probs(module, found['sources'][i],
                                                 found['max_new_tokens'], 2)
    return beam_reference.beam_search(search, k=2, max_new_tokens=found['max_new_tokens'])
  ties = beam_reference.differences_are_ties(ours, theirs, reference)
  assert ties <= 1 and results['ct2_float32']['differ_from_ours'] == ties
  if ties == 0:
    assert results['ct2_float32']['tokens'] == results['ours']['tokens']
  assert '| ct2_int8 | 2 |' in err  # the Markdown table
  assert sorted(os.listdir(workdir)) == before  # the exports went elsewhere
