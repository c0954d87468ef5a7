"""bench/decode_engines.py runs end to end on a tiny trained workdir and a few test2016 lines:
every engine in its own subprocess, CTranslate2 float32 identical to ours, the report's
figures present (no timing assertions); bench/decode_per_batch.py reports every batch;
bench/decode_uniform.py reports steps, uniform batches and the pass, with the same tokens."""

import json
import os

import export_workdirs
import pytest

from bench import decode_engines, decode_per_batch, decode_uniform

pytest.importorskip('ctranslate2')
pytest.importorskip('transformers')


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


def test_per_batch_bench_reports_every_batch_and_the_totals(tmp_path_factory, capsys):
  workdir = export_workdirs.trained(tmp_path_factory, 'mt')
  decode_per_batch.main([f'--workdir={workdir}', '--lines=5', '--beam=1', '--repeats=1',
                         '--max_new_tokens=8', '--batch_size=4'])
  *batches, totals = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  assert [b['first'] for b in batches] == [0, 4]  # 5 lines, sorted, in batches of 4
  assert all(b['output_tokens'] > 0 and b['ours_s'] > 0 and b['ct2_s'] > 0 for b in batches)
  assert totals['beam'] == 1
  assert abs(totals['ours_s'] - sum(b['ours_s'] for b in batches)) < 1e-2


def test_uniform_bench_forces_the_lengths_and_reports_steps_batches_and_the_pass(
    tmp_path_factory, capsys):
  workdir = export_workdirs.trained(tmp_path_factory, 'mt')
  decode_uniform.main([f'--workdir={workdir}', '--lines=5', '--beam=1', '--repeats=1',
                       '--sizes=2', '--lengths=2,3,5', '--max_new_tokens=8', '--batch_size=4'])
  lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  assert [(x['line'], x['engine']) for x in lines] == [
      ('step', 'ours'), ('step', 'ct2'), ('batch', 'ours'), ('batch', 'ct2'),
      ('pass', 'ours'), ('pass', 'ct2')]
  assert all(set(x['ms_per_step']) == {'2-3', '3-5'} for x in lines[:2])
  assert all(x['tokens'] == [2 * 2, 2 * 3, 2 * 5] for x in lines[:2])  # 2 sentences, forced
  ours_batch, ct2_batch, ours_pass, ct2_pass = lines[2:]
  assert ours_batch['tokens'] == ct2_batch['tokens'] > 0  # the same search: the same lengths
  assert ours_pass['tokens'] == ct2_pass['tokens'] and ours_pass['sentences'] == 5
  assert all(x['ms_per_sentence_step'] > 0 for x in lines[2:])
