"""bench/decode_engines.py runs end to end on a tiny trained workdir and a few test2016 lines:
every engine in its own subprocess, CTranslate2 float32 identical to ours, the report's
figures present (no timing assertions)."""

import json
import os

import export_workdirs
import extras

from bench import decode_engines

extras.require('ctranslate2')
extras.require('transformers')


def test_bench_runs_every_engine_and_checks_outputs(tmp_path_factory, capsys):
  workdir = export_workdirs.trained(tmp_path_factory, 'mt')
  before = sorted(os.listdir(workdir))
  decode_engines.main([f'--workdir={workdir}', '--lines=5', '--beam_sizes=2', '--repeats=1',
                       '--warm_passes=1', '--max_new_tokens=16', '--batch_size=4'])
  out, err = capsys.readouterr()
  report = json.loads(out.strip().splitlines()[-1])
  assert report['sentences'] == 5 and report['max_new_tokens'] == 16
  results = report['results']['2']
  assert set(results) == set(decode_engines.ENGINES)
  for name, r in results.items():
    assert r['tokens'] > 0 and r['warm_tok_s'] > 0 and r['peak_rss_mb'] > 0, name
    assert r['cold_s'] > 0 and len(r['repeats']) == 1, name
  assert results['ct2_float32']['differ_from_ours'] == 0  # the same computation
  assert results['ct2_float32']['tokens'] == results['ours']['tokens']
  assert '| ct2_int8 | 2 |' in err  # the Markdown table
  assert sorted(os.listdir(workdir)) == before  # the exports went elsewhere
