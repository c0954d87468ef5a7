"""Decoding engines side by side on one trained translation model: decode.py's code path
(`ours`), CTranslate2 float32 and int8, and transformers `generate`.

    python bench/decode_engines.py --workdir=DIR [--lines=N] [--beam_sizes=4,1]
        [--batch_size=32] [--max_new_tokens=64] [--repeats=3] [--threads=2]
        [--engines=ours,ct2_float32,ct2_int8,transformers] [--checkpoint_step=N]

The newest checkpoint of DIR (or --checkpoint_step) is exported once (export.py's code:
`--format=ctranslate2` and `--format=transformers`, into a temporary directory, never into
DIR) so every engine runs the same weights on the same sources: the first --lines lines of
test2016 (data/multi30k/test_2016_flickr.en.gz, or --input_file), tokenized and cut to the
model's max_len as decode.py does. Same beam, batch size (sentences), length limit
(--max_new_tokens generated tokens, EOS included) and length penalty (none: decode.py's alpha=0,
CTranslate2's and transformers' length_penalty=0).

Each (engine, beam) runs in a subprocess of its own, pinned to --threads CPUs, each engine
using them as fast as it can: ours decodes --threads batches at once (the session's workers),
CTranslate2 likewise (inter_threads=--threads, intra_threads=1: on the 2-core VM, one thread
per batch ran greedy 3.9x faster than intra_threads=2, and two batches at once 2x faster
again), transformers with torch.set_num_threads(--threads) (it has no batch parallelism), so
its peak RSS (ru_maxrss) and cold time are its own; engines are interleaved in each
repetition (rotated order) so that they share the machine's load alike. Per run:
  cold_s      from the subprocess' start to the end of its first pass over the sources
              (interpreter, imports, loading the model, compilation and that first pass);
              ours uses decode.py's persistent compilation cache (on by default there),
              empty in the first repetition: `cold_first_s` is that run (every shape
              compiled), `cold_s` the median of the later ones (shapes loaded from it);
  warm_tok_s  target tokens (EOS included) per second of the best of --warm_passes later
              passes (the same sources again: compiled, caches warm);
  peak_rss_mb the subprocess' peak resident memory;
  foreign_cores the CPU other processes used meanwhile (a shared machine's noise).
The report has the median over repetitions, and per engine how many sentences differ from
ours (0 expected for ct2_float32: the same computation; transformers' Marian hard-codes
LayerNorm epsilon 1e-5, int8 is an approximation). Prints one JSON object, and a Markdown
table on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gzip
import io
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from common.tokens import DEFAULT_MIN_NEW_TOKENS  # noqa: E402

TEST2016 = os.path.join(ROOT, 'data', 'multi30k', 'test_2016_flickr.en.gz')
ENGINES = ('ours', 'ct2_float32', 'ct2_int8', 'transformers')
EOS = 1


# ----------------------------------------------------------------------------- engines

def _ours(job):
  """decode.py's code path: `inference.load` and the session's search over token ids."""
  import inference  # pylint: disable=import-outside-toplevel
  from autoregressive import program_cache  # pylint: disable=import-outside-toplevel

  # decode.py's persistent compilation cache (its default is on): empty in the first
  # repetition, so that cold run compiles every shape; later repetitions load them.
  program_cache.enable_compilation_cache(job['xla_cache'])
  session = inference.load(job['workdir'], step=job['step'])
  settings = dict(beam_size=job['beam'], alpha=None if job['beam'] == 1 else 0.0,
                  max_new_tokens=job['max_new_tokens'], batch_size=job['batch_size'])
  sources = job['sources']

  def run():
    return [list(map(int, h[0].tokens)) for h in session.search(sources, scores=False,
                                                                **settings)]
  return run


def ct2_vocab_and_pieces(directory: str, sources):
  """(CTranslate2's vocabulary, `sources` as its input pieces): our ids without the EOS, which
  the model's config adds (add_source_eos)."""
  with open(os.path.join(directory, 'shared_vocabulary.json'), encoding='utf-8') as f:
    vocab = json.load(f)
  return vocab, [[vocab[i] for i in (s[:-1] if s[-1] == EOS else s)] for s in sources]


def ct2_options(beam: int, max_new_tokens: int, max_len: int, batch_size: int) -> dict:
  """`translate_batch`'s options for decode.py's search: no length penalty, decode.py's
  minimum length, EOS returned."""
  return dict(beam_size=beam, length_penalty=0.0, max_decoding_length=max_new_tokens,
              min_decoding_length=DEFAULT_MIN_NEW_TOKENS, max_input_length=max_len,
              max_batch_size=batch_size, batch_type='examples', return_end_token=True)


def _ct2(job, compute_type):
  import ctranslate2  # pylint: disable=import-outside-toplevel

  vocab, pieces = ct2_vocab_and_pieces(job['ct2_dir'], job['sources'])
  ids = {token: i for i, token in enumerate(vocab)}
  translator = ctranslate2.Translator(job['ct2_dir'], device='cpu', compute_type=compute_type,
                                      inter_threads=job['threads'], intra_threads=1)
  options = ct2_options(job['beam'], job['max_new_tokens'], job['model_max_len'],
                        job['batch_size'])

  def run():
    results = translator.translate_batch(pieces, **options)
    return [[ids[t] for t in r.hypotheses[0]] for r in results]
  return run


def _transformers(job):
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel

  torch.set_num_threads(job['threads'])
  model = transformers.AutoModelForSeq2SeqLM.from_pretrained(job['hf_dir']).eval()
  sources = job['sources']
  order = sorted(range(len(sources)), key=lambda i: len(sources[i]))  # as ours and CT2 batch

  def run():
    outputs = [None] * len(sources)
    for start in range(0, len(order), job['batch_size']):
      chunk = order[start:start + job['batch_size']]
      inputs = torch.zeros((len(chunk), max(len(sources[i]) for i in chunk)), dtype=torch.long)
      for row, i in enumerate(chunk):
        inputs[row, :len(sources[i])] = torch.tensor(sources[i])
      with torch.inference_mode():
        generated = model.generate(input_ids=inputs, attention_mask=inputs > 0,
                                   num_beams=job['beam'], length_penalty=0.0,
                                   early_stopping='never', do_sample=False,
                                   max_new_tokens=job['max_new_tokens'],
                                   min_new_tokens=DEFAULT_MIN_NEW_TOKENS)
      for row, i in enumerate(chunk):
        ids = generated[row, 1:].tolist()  # after the decoder start token
        outputs[i] = ids[:ids.index(EOS) + 1] if EOS in ids else [t for t in ids if t]
    return outputs
  return run


LOADERS = {'ours': _ours, 'ct2_float32': lambda job: _ct2(job, 'float32'),
           'ct2_int8': lambda job: _ct2(job, 'int8'), 'transformers': _transformers}


# ----------------------------------------------------------------------------- worker

def _cpu_snapshot():
  """(busy jiffies of the whole machine, this process' CPU seconds, wall seconds)."""
  with open('/proc/stat') as f:
    v = [int(x) for x in f.readline().split()[1:9]]
  t = os.times()
  return (sum(v) - v[3] - v[4]) / os.sysconf('SC_CLK_TCK'), t.user + t.system, time.time()


def _foreign(a, b) -> float:
  """Cores' worth of CPU other processes used between two snapshots."""
  return max(0.0, (b[0] - a[0]) - (b[1] - a[1])) / max(b[2] - a[2], 1e-9)


def _peak_rss_mb() -> float:
  """This process' peak resident memory (VmHWM: unlike ru_maxrss, not inherited from the
  parent that forked it)."""
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith('VmHWM:'):
        return round(int(line.split()[1]) / 1024, 1)
  return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _pin(threads: int) -> None:
  """Runs this process (and the threads it starts) on `threads` CPUs."""
  if hasattr(os, 'sched_setaffinity'):
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, set(cpus[:threads]))


def _worker(job_path: str) -> None:
  """One engine, one beam size: cold pass, then the warm passes; a JSON line on stdout."""
  with open(job_path, encoding='utf-8') as f:
    job = json.load(f)
  _pin(job['threads'])
  with contextlib.redirect_stdout(io.StringIO()):  # engines' chatter: stdout is the result
    run = LOADERS[job['engine']](job)
    outputs = run()
    cold = time.time() - job['launched_at']
    passes = []
    for _ in range(job['warm_passes']):
      a = _cpu_snapshot()
      run()
      b = _cpu_snapshot()
      passes.append((b[2] - a[2], _foreign(a, b)))
  tokens = sum(len(o) for o in outputs)  # EOS included where the output ended with it
  best, foreign = min(passes)
  result = {'engine': job['engine'], 'beam': job['beam'], 'cold_s': round(cold, 2),
            'warm_s': round(best, 3), 'warm_tok_s': round(tokens / best, 1),
            'warm_sent_s': round(len(outputs) / best, 1), 'tokens': tokens,
            'foreign_cores': round(foreign, 2),
            'peak_rss_mb': _peak_rss_mb()}
  with open(job['outputs_path'], 'w', encoding='utf-8') as f:
    json.dump(outputs, f)
  print(json.dumps(result), flush=True)


# ----------------------------------------------------------------------------- parent

def _sources(workdir: str, input_file: str, lines: int):
  """(lines, our token ids cut to the model's max_len as decode.py cuts them, max_len)."""
  from autoregressive.session import Session  # pylint: disable=import-outside-toplevel
  from input_pipeline import tokenizers  # pylint: disable=import-outside-toplevel
  from workdir import restore  # pylint: disable=import-outside-toplevel

  opener = gzip.open if input_file.endswith('.gz') else open
  with opener(input_file, 'rt', encoding='utf-8') as f:
    text = [line for line in f.read().splitlines() if line.strip()]
  text = text[:lines] if lines else text
  config, module = restore.read_model(workdir)  # the session's encoding; an abstract module
  session = Session(module, tokenizers.load_tokenizer(workdir), config, warn=lambda message: None)
  return text, session.encode(text), module.config.max_len


def _export(workdir: str, step, scratch: str, engines) -> dict:
  """{'ct2_dir': ..., 'hf_dir': ...}: the checkpoint exported as export.py writes it."""
  from hf_export import writer  # pylint: disable=import-outside-toplevel

  dirs = {}
  if any(e.startswith('ct2') for e in engines):
    dirs['ct2_dir'] = os.path.join(scratch, 'ct2')
    writer.export_workdir(workdir, dirs['ct2_dir'], step=step, format='ctranslate2')
  if 'transformers' in engines:
    dirs['hf_dir'] = os.path.join(scratch, 'hf')
    writer.export_workdir(workdir, dirs['hf_dir'], step=step, format='transformers')
  return dirs


def _run_job(job: dict, scratch: str, timeout: int) -> dict:
  name = f"{job['engine']}_beam{job['beam']}_{job['repeat']}"
  job = {**job, 'outputs_path': os.path.join(scratch, f'{name}.out.json')}
  path = os.path.join(scratch, f'{name}.job.json')
  job['launched_at'] = time.time()
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(job, f)
  # OMP_WAIT_POLICY=PASSIVE: OpenMP threads (torch's, CTranslate2's) that spin while waiting
  # are slowed 10x and more when another process holds one of the pinned CPUs (measured on
  # the shared 2-core VM: transformers beam 4, 2 threads, 12 s instead of 0.8 s).
  env = {'OMP_WAIT_POLICY': 'PASSIVE', **os.environ,
         'JAX_PLATFORMS': os.environ.get('JAX_PLATFORMS', 'cpu'), 'TF_CPP_MIN_LOG_LEVEL': '3'}
  proc = subprocess.run([sys.executable, os.path.abspath(__file__), f'--worker={path}'],
                        capture_output=True, text=True, timeout=timeout, env=env, check=False)
  if proc.returncode != 0:
    raise RuntimeError(f'{name} failed:\n{proc.stderr[-3000:]}')
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  with open(job['outputs_path'], encoding='utf-8') as f:
    result['outputs'] = json.load(f)
  return result


def _summary(runs: list[dict], reference: dict) -> dict:
  """Medians over repetitions per engine; sentences that differ from ours."""
  out = {'cold_first_s': runs[0]['cold_s']}  # ours: compiling every shape (empty cache)
  for key in ('warm_tok_s', 'warm_sent_s', 'foreign_cores'):
    out[key] = round(statistics.median(r[key] for r in runs), 2)
  # ours: loading the compiled shapes from decode.py's cache (as its second run does)
  out['cold_s'] = round(statistics.median(r['cold_s'] for r in runs[1:] or runs), 2)
  out['peak_rss_mb'] = max(r['peak_rss_mb'] for r in runs)
  out['tokens'] = runs[0]['tokens']
  out['repeats'] = [{k: r[k] for k in ('cold_s', 'warm_tok_s', 'foreign_cores')} for r in runs]
  if reference is not None:
    out['differ_from_ours'] = sum(a != b for a, b in zip(runs[0]['outputs'], reference,
                                                         strict=True))
  return out


def _table(report: dict) -> str:
  rows = ['| engine | beam | warm tok/s | warm sent/s | cold s (first) | cold s | peak RSS MB '
          '| differ from ours | foreign cores |', '|---|---|---|---|---|---|---|---|---|']
  for beam, engines in report['results'].items():
    for name, r in engines.items():
      rows.append(f"| {name} | {beam} | {r['warm_tok_s']} | {r['warm_sent_s']} "
                  f"| {r['cold_first_s']} | {r['cold_s']} "
                  f"| {r['peak_rss_mb']} | {r.get('differ_from_ours', '-')} "
                  f"| {r['foreign_cores']} |")
  return '\n'.join(rows)


def bench(args) -> dict:
  engines = [e for e in args.engines.split(',') if e]
  unknown = sorted(set(engines) - set(ENGINES))
  if unknown:
    raise SystemExit(f'decode_engines.py: error: unknown engine(s) {unknown}; known: {ENGINES}')
  beams = [int(b) for b in args.beam_sizes.split(',')]
  text, sources, model_max_len = _sources(args.workdir, args.input_file, args.lines)
  with tempfile.TemporaryDirectory(prefix='decode_engines_') as scratch:
    dirs = _export(args.workdir, args.checkpoint_step, scratch, engines)
    job = {'workdir': args.workdir, 'step': args.checkpoint_step, 'sources': sources,
           'xla_cache': os.path.join(scratch, 'xla_cache'),
           'batch_size': args.batch_size,
           'max_new_tokens': min(args.max_new_tokens, model_max_len),
           'model_max_len': model_max_len, 'threads': args.threads,
           'warm_passes': args.warm_passes, **dirs}
    runs = {beam: {e: [] for e in engines} for beam in beams}
    for repeat in range(args.repeats):
      order = engines[repeat % len(engines):] + engines[:repeat % len(engines)]
      for beam in beams:
        for engine in order:
          result = _run_job({**job, 'engine': engine, 'beam': beam, 'repeat': repeat},
                            scratch, args.timeout)
          print(json.dumps({k: v for k, v in result.items() if k != 'outputs'}),
                file=sys.stderr, flush=True)
          runs[beam][engine].append(result)
  if args.outputs_dir:  # for checking differences (near-ties) outside the report
    os.makedirs(args.outputs_dir, exist_ok=True)
    found = {'sources': sources, 'max_new_tokens': job['max_new_tokens'],
             'outputs': {beam: {e: r[0]['outputs'] for e, r in per_engine.items()}
                         for beam, per_engine in runs.items()}}
    with open(os.path.join(args.outputs_dir, 'outputs.json'), 'w', encoding='utf-8') as f:
      json.dump(found, f)
  results = {}
  for beam, per_engine in runs.items():
    reference = per_engine['ours'][0]['outputs'] if 'ours' in per_engine else None
    results[beam] = {e: _summary(r, None if e == 'ours' else reference)
                     for e, r in per_engine.items()}
  return {'bench': 'decode_engines', 'date': datetime.datetime.now().isoformat(timespec='seconds'),
          'machine': platform.processor() or platform.machine(), 'cpus': os.cpu_count(),
          'command': ' '.join([os.path.basename(sys.executable), *sys.argv]),
          'loadavg_1min_end': round(os.getloadavg()[0], 2),
          'workdir': args.workdir, 'sentences': len(text),
          'max_new_tokens': job['max_new_tokens'],
          'batch_size': args.batch_size, 'threads': args.threads, 'repeats': args.repeats,
          'results': results}


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('--workdir', help='A trained translation workdir (read only).')
  ap.add_argument('--checkpoint_step', type=int, default=None, help='Default: the newest.')
  ap.add_argument('--input_file', default=TEST2016)
  ap.add_argument('--lines', type=int, default=0, help='The first N lines (0: all).')
  ap.add_argument('--beam_sizes', default='4,1')
  ap.add_argument('--batch_size', type=int, default=32)
  ap.add_argument('--max_new_tokens', type=int, default=64,
                  help='Generated tokens, EOS included.')
  ap.add_argument('--engines', default=','.join(ENGINES))
  ap.add_argument('--threads', type=int, default=2)
  ap.add_argument('--repeats', type=int, default=3)
  ap.add_argument('--warm_passes', type=int, default=2)
  ap.add_argument('--timeout', type=int, default=1800, help='Seconds per engine run.')
  ap.add_argument('--outputs_dir', default=None,
                  help="Writes DIR/outputs.json: the sources' ids and every engine's token "
                       'ids (first repetition) per beam size.')
  ap.add_argument('--worker', help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.worker:
    _worker(args.worker)
    return
  if not args.workdir:
    ap.error('--workdir is required')
  report = bench(args)
  print(_table(report), file=sys.stderr)
  print(json.dumps(report))


if __name__ == '__main__':
  main()
