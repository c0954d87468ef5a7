"""The data path at the paper's scale, by simulation: a synthetic corpus of WMT14's size (or
LM1B's), prepared, started and read as a run would.

    python bench/data_scale.py --kind=translation --size=4500000 --root=/tmp/wmt_sim
    python bench/data_scale.py --kind=lm --size=30000000 --root=/tmp/lm1b_sim
    python bench/data_scale.py --kind=translation --size=3000 --root=DIR   # the suite's size

Prints one JSON object. Each measured stage runs in its own process (its time from process
start, its peak RSS from `wait4`), as a run would start:

  corpus      the synthetic files (not timed as preparation): `size` lines, words drawn with
              the bundled corpora's word frequencies (Multi30k's English for the source and
              language-model text, its German for the target; the target and the language
              model's text with compounds of two words, so that the tokenizer meets as many
              word types as a real corpus offers its 32-37k pieces), lengths like WMT14 En-De's or
              LM1B's (below)
  prepare     a first `get_datasets` and its first batch: the files read into the prepared
              text store, sentencepiece trained on `tokenizer_max_sentences` sentences, the
              train split tokenized once; wall time and peak RSS
  start       a new workdir on the prepared data (the shared tokenizer is copied in, nothing
              is read whole or tokenized): time from process start to the first batch
  resume      the same workdir again, its iterator state restored: time to the first batch
  throughput  (translation) packed batches of `--batch_size` x `--max_length` per second
              with 0, 1 and 2 Grain worker processes, after a warm-up; (lm) random blocks
  sampled     (translation, with `--subword_alpha=A`) the same with segmentations sampled
              from the text at every reading (`config.data.subword_sampling_alpha=A`)

`--half` also prepares a corpus of half the size, for the "memory does not grow with the
corpus" comparison. The first-step time of a real run adds the model's compilation, which
does not depend on the corpus.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402

# Sentence lengths in words. WMT14 En-De's training side averages ~23 words (English) with a
# long tail past 100 (Bojar et al. 2014; the pairs sacrebleu ships): a lognormal with median
# 19 and sigma 0.65 gives mean ~23.5 and 1% above 86 words. German runs ~0.95x English in
# words. LM1B's sentences average ~27 words (Chelba et al. 2013: 0.8B words, 30M sentences).
_LENGTHS = {'translation': (19.0, 0.65), 'lm': (22.0, 0.6)}
_TARGET_RATIO = (0.95, 0.15)  # target words / source words: lognormal median, sigma
_MAX_WORDS = 250
_COMPOUND_RATE = 0.08  # German tokens that are compounds of two words (new word types)


def _vocabulary(name: str) -> tuple[np.ndarray, np.ndarray]:
  """Word types of a bundled Multi30k side and their frequencies."""
  counts = collections.Counter()
  with gzip.open(os.path.join(REPO, 'data', 'multi30k', f'train.{name}.gz'), 'rt') as f:
    for line in f:
      counts.update(line.split())
  words = np.array(list(counts), dtype=object)
  freq = np.array(list(counts.values()), np.float64)
  return words, freq / freq.sum()


def _sentences(rng, words, probs, lengths, compounds=False):
  flat = rng.choice(len(words), size=int(lengths.sum()), p=probs)
  tokens = words[flat]
  if compounds:
    where = rng.random(len(flat)) < _COMPOUND_RATE
    extra = words[rng.choice(len(words), size=int(where.sum()), p=probs)]
    tokens[where] = tokens[where] + np.char.lower(extra.astype(str)).astype(object)
  ends = np.cumsum(lengths)
  return [' '.join(tokens[e - n:e]) for e, n in zip(ends.tolist(), lengths.tolist(),
                                                    strict=True)]


def make_corpus(kind: str, size: int, root: str, seed: int = 0) -> dict[str, str]:
  """Writes the synthetic corpus (once per root, kind and size); returns its files."""
  os.makedirs(root, exist_ok=True)
  names = (['train.en', 'train.de', 'valid.en', 'valid.de'] if kind == 'translation'
           else ['train.txt', 'valid.txt'])
  files = {n: os.path.join(root, f'{n}.{size}') for n in names}
  if all(os.path.exists(p) for p in files.values()):
    return files
  rng = np.random.default_rng(seed)
  en, en_p = _vocabulary('en')
  de, de_p = _vocabulary('de')
  median, sigma = _LENGTHS[kind]
  for split, n in (('train', size), ('valid', max(100, min(3000, size // 100)))):
    outs = ({s: open(files[f'{split}.{s}'] + '.tmp', 'w') for s in ('en', 'de')}  # noqa: SIM115
            if kind == 'translation' else {'en': open(files[f'{split}.txt'] + '.tmp', 'w')})  # noqa: SIM115
    for first in range(0, n, 100_000):
      m = min(100_000, n - first)
      src = np.clip(rng.lognormal(np.log(median), sigma, m), 1, _MAX_WORDS).astype(np.int64)
      # (the language model's text gets compounds too: LM1B's 32k pieces need the word types)
      outs['en'].write('\n'.join(_sentences(rng, en, en_p, src, compounds=kind == 'lm')) + '\n')
      if kind == 'translation':
        ratio = rng.lognormal(np.log(_TARGET_RATIO[0]), _TARGET_RATIO[1], m)
        tgt = np.clip(np.round(src * ratio), 1, _MAX_WORDS).astype(np.int64)
        outs['de'].write('\n'.join(_sentences(rng, de, de_p, tgt, compounds=True)) + '\n')
    for f in outs.values():
      f.close()
  for path in files.values():
    os.replace(path + '.tmp', path)
  return files


def _config(kind: str, files: dict[str, str], data_dir: str, batch_size: int | None,
            max_length: int | None, vocab_size: int | None, num_workers: int = 0,
            subword_alpha: float = 0.0):
  if kind == 'translation':
    from configs import wmt14_base
    config = wmt14_base.get_config()
    config.data.dataset = 'parallel_text'
    config.data.train_files = f"{files['train.en']},{files['train.de']}"
    config.data.eval_files = f"{files['valid.en']},{files['valid.de']}"
  else:
    from configs import lm_1b
    config = lm_1b.get_config()
    config.data.dataset = 'text_files'
    config.data.train_files, config.data.eval_files = files['train.txt'], files['valid.txt']
  config.data.data_dir = data_dir
  config.data.max_length = max_length or config.data.max_length
  config.model.max_len = max(config.model.max_len, config.data.max_length + 1)
  config.train.batch_size = batch_size or config.train.batch_size
  if vocab_size:
    config.data.vocab_size = config.model.vocab_size = vocab_size
  config.data.num_workers = num_workers
  config.data.subword_sampling_alpha = subword_alpha
  return config


def _stage(args) -> dict:
  """One measured stage, in this process (the parent times it and reads its RSS)."""
  import input_pipeline
  from model.kinds import adapter_of
  files = json.loads(args.files)
  config = _config(args.kind, files, args.data_dir, args.batch_size, args.max_length,
                   args.vocab_size, args.num_workers, args.subword_alpha)
  layout = adapter_of(config.model).batch_layout
  ds = input_pipeline.get_datasets(config, workdir=args.workdir, layout=layout,
                                   process_index=0, process_count=1)
  if args.stage == 'resume':
    with open(os.path.join(args.workdir, 'iterator.json')) as f:
      ds.train_iter.set_state(json.load(f))
  batch = next(ds.train_iter)
  first_batch_s = time.time() - args.started
  out = {'first_batch_s': round(first_batch_s, 2)}
  if args.stage == 'start':
    for _ in range(3):
      next(ds.train_iter)
    with open(os.path.join(args.workdir, 'iterator.json'), 'w') as f:
      json.dump(ds.train_iter.get_state(), f)
  if args.stage == 'throughput':
    for _ in range(args.warmup):
      next(ds.train_iter)
    start = time.perf_counter()
    real = examples = 0
    for _ in range(args.num_batches):
      batch = next(ds.train_iter)
      real += int((batch['targets'] > 0).sum())
      if 'targets_segmentation' in batch:
        examples += int(batch['targets_segmentation'].max(axis=1).sum())
    seconds = time.perf_counter() - start
    out.update(batches_per_s=round(args.num_batches / seconds, 2),
               target_tokens_per_s=round(real / seconds),
               batch_shape=list(batch['targets'].shape))
    if examples:
      out['pairs_per_s'] = round(examples / seconds)
      out['nonpad_fraction_targets'] = round(real / (args.num_batches * batch['targets'].size), 4)
  ds.train_iter.close()
  return out


def _run_stage(args, stage: str, workdir: str, num_workers: int = 0, data_dir=None,
               subword_alpha: float = 0.0) -> dict:
  """Runs `stage` in a new process: its JSON, its wall time and its peak RSS (GiB)."""
  command = [sys.executable, os.path.abspath(__file__), f'--stage={stage}', f'--kind={args.kind}',
             f'--files={json.dumps(args.corpus)}', f'--data_dir={data_dir or args.data_dir}',
             f'--workdir={workdir}', f'--num_workers={num_workers}',
             f'--subword_alpha={subword_alpha}',
             *(f'--{k}={getattr(args, k)}' for k in ('batch_size', 'max_length', 'vocab_size')
               if getattr(args, k)),
             f'--num_batches={args.num_batches}', f'--warmup={args.warmup}',
             f'--started={time.time()}']
  start = time.time()
  with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
    process = subprocess.Popen(command, stdout=out, stderr=err, cwd=REPO)
    peaks = {'RssAnon': 0, 'RssFile': 0}
    while True:  # the process's own memory and its mapped file pages, sampled
      pid, status, usage = os.wait4(process.pid, os.WNOHANG)
      if pid:
        break
      for key, kib in _memory(process.pid).items():
        peaks[key] = max(peaks[key], kib)
      time.sleep(0.1)
    code = os.waitstatus_to_exitcode(status)
    out.seek(0)
    err.seek(0)
    if code:
      raise SystemExit(f'data_scale: stage {stage} failed ({code}):\n'
                       f'{err.read().decode()[-3000:]}')
    lines = out.read().decode().strip().splitlines()
    result = json.loads(lines[-1])
    # The preparation's own lines: how long the text, the tokenizer and the ids each took.
    said = [line for line in lines[:-1] if line.startswith(('prepared ', 'tokenized ', 'trained '))]
    if said:
      result['log'] = said
  # peak_rss_gib: the kernel's peak resident set (ru_maxrss), mapped file pages included;
  # peak_anon_gib: the process's own memory (sampled every 0.1 s): what cannot be evicted.
  result.update(wall_s=round(time.time() - start, 2),
                peak_rss_gib=round(usage.ru_maxrss / 2**20, 3),
                peak_anon_gib=round(peaks['RssAnon'] / 2**20, 3),
                peak_file_gib=round(peaks['RssFile'] / 2**20, 3))
  return result


def _memory(pid: int) -> dict[str, int]:
  """RssAnon and RssFile of `pid` in KiB (Linux's /proc; empty elsewhere or once it ended)."""
  try:
    with open(f'/proc/{pid}/status') as f:
      return {line.split(':')[0]: int(line.split()[1]) for line in f
              if line.startswith(('RssAnon:', 'RssFile:'))}
  except OSError:
    return {}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--kind', choices=('translation', 'lm'), default='translation')
  parser.add_argument('--size', type=int, default=4_500_000,
                      help='training lines (pairs for translation)')
  parser.add_argument('--root', required=False, help='where the corpus and data dirs go')
  parser.add_argument('--batch_size', type=int, default=None,
                      help="rows a batch (default: the preset's, wmt14_base's 104 / lm_1b's 256)")
  parser.add_argument('--max_length', type=int, default=None,
                      help="tokens a row (default: the preset's, 256 / 1023)")
  parser.add_argument('--vocab_size', type=int, default=None,
                      help="sentencepiece pieces (default: the preset's; a small corpus "
                      'needs fewer)')
  parser.add_argument('--num_batches', type=int, default=100)
  parser.add_argument('--warmup', type=int, default=5)
  parser.add_argument('--workers', default='0,1,2', help='Grain worker counts to measure')
  parser.add_argument('--subword_alpha', type=float, default=0.0,
                      help='also measure the throughput with segmentations sampled at this alpha')
  parser.add_argument('--half', action='store_true', help='also prepare half the corpus')
  parser.add_argument('--stages', default='prepare,start,resume,throughput',
                      help='which to measure (start and resume need a prepared root)')
  parser.add_argument('--stage', help=argparse.SUPPRESS)
  parser.add_argument('--files', help=argparse.SUPPRESS)
  parser.add_argument('--data_dir', help=argparse.SUPPRESS)
  parser.add_argument('--workdir', help=argparse.SUPPRESS)
  parser.add_argument('--num_workers', type=int, default=0, help=argparse.SUPPRESS)
  parser.add_argument('--started', type=float, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.stage:
    print(json.dumps(_stage(args)))
    return
  if not args.root:
    parser.error('--root is required')
  started = time.time()
  args.corpus = make_corpus(args.kind, args.size, args.root)
  corpus_s = time.time() - started
  args.data_dir = os.path.join(args.root, f'data.{args.size}')
  runs = os.path.join(args.root, f'runs.{args.size}')
  results = {'corpus_s': round(corpus_s, 1),
             'corpus_bytes': sum(os.path.getsize(p) for p in args.corpus.values())}
  stages = args.stages.split(',')
  if 'prepare' in stages:
    results['prepare'] = _run_stage(args, 'prepare', os.path.join(runs, 'first'))
  if 'start' in stages:
    results['start'] = _run_stage(args, 'start', os.path.join(runs, 'second'))
  if 'resume' in stages:
    results['resume'] = _run_stage(args, 'resume', os.path.join(runs, 'second'))
  workers = [int(w) for w in args.workers.split(',') if w] if args.kind == 'translation' else [0]
  if 'throughput' in stages:
    results['throughput'] = {
        str(w): _run_stage(args, 'throughput', os.path.join(runs, 'second'), w) for w in workers}
  if 'throughput' in stages and args.subword_alpha and args.kind == 'translation':
    results['sampled'] = {
        str(w): _run_stage(args, 'throughput', os.path.join(runs, f'sampled{w}'), w,
                           subword_alpha=args.subword_alpha) for w in workers}
  if args.half:
    whole = args.corpus, args.size
    args.size //= 2
    args.corpus = make_corpus(args.kind, args.size, args.root)
    results['prepare_half'] = _run_stage(args, 'prepare', os.path.join(args.root, 'half_run'),
                                         data_dir=os.path.join(args.root, f'data.{args.size}'))
    args.corpus, args.size = whole
  print(json.dumps({
      'benchmark': 'data_scale', 'kind': args.kind, 'size': args.size,
      'batch': results.get('throughput', {}).get('0', {}).get('batch_shape'),
      'machine': f'{platform.machine()}, {os.cpu_count()} CPU cores, {platform.python_version()}',
      'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
      'command': ' '.join(sys.argv), **results}, indent=2))


if __name__ == '__main__':
  main()
