"""Small random `transformers` checkpoints saved as the Hub's are (save_pretrained), built
here with transformers' own classes (no download): OPUS-MT-style Marian with sentencepiece
models trained on Multi30k, GPT-2 with a byte-level BPE trained on Tiny Shakespeare, BERT with
a WordPiece vocabulary."""

from __future__ import annotations

import gzip
import io
import json
import os

import numpy as np

from tests import REPO


def multi30k(split: str, lang: str, count: int | None = None) -> list[str]:
  with gzip.open(os.path.join(REPO, 'data', 'multi30k', f'{split}.{lang}.gz'), 'rt') as f:
    lines = [line.rstrip('\n') for line in f]
  return lines[:count] if count else lines


def shakespeare() -> str:
  with open(os.path.join(REPO, 'data', 'tinyshakespeare', 'input.txt')) as f:
    return f.read()


def _spm(lines: list[str], vocab_size: int) -> bytes:
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  out = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out,
                                 vocab_size=vocab_size, model_type='unigram',
                                 character_coverage=1.0, minloglevel=2,
                                 pad_id=-1, bos_id=-1, eos_id=1, unk_id=0)
  return out.getvalue()


def marian(directory: str, **config) -> str:
  """An OPUS-MT-like en-de Marian model: swish, scaled embeddings, eos 0, unk 1, pad last,
  separate source/target sentencepiece models with one joint vocab.json."""
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  from transformers import MarianConfig, MarianMTModel, MarianTokenizer  # pylint: disable=import-outside-toplevel
  os.makedirs(directory, exist_ok=True)
  models = {'source.spm': _spm(multi30k('train', 'en', 3000), 300),
            'target.spm': _spm(multi30k('train', 'de', 3000), 300)}
  pieces = []
  for data in models.values():
    sp = spm.SentencePieceProcessor(model_proto=data)
    pieces += [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
  vocab = {'</s>': 0, '<unk>': 1}
  for piece in pieces:
    vocab.setdefault(piece, len(vocab))
  vocab['<pad>'] = len(vocab)
  for name, data in models.items():
    with open(os.path.join(directory, name), 'wb') as f:
      f.write(data)
  with open(os.path.join(directory, 'vocab.json'), 'w') as f:
    json.dump(vocab, f)
  MarianTokenizer(os.path.join(directory, 'source.spm'), os.path.join(directory, 'target.spm'),
                  os.path.join(directory, 'vocab.json')).save_pretrained(directory)
  fields = dict(vocab_size=len(vocab), d_model=32, encoder_layers=2, decoder_layers=2,
                encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                decoder_ffn_dim=64, max_position_embeddings=64, activation_function='swish',
                pad_token_id=len(vocab) - 1, decoder_start_token_id=len(vocab) - 1,
                eos_token_id=0, scale_embedding=True, dropout=0.1, attention_dropout=0.0)
  fields.update(config)
  torch.manual_seed(0)
  model = MarianMTModel(MarianConfig(**fields)).eval()
  with torch.no_grad():  # random non-zero biases, LayerNorms and logits bias
    for name, p in model.named_parameters():
      if 'embed_positions' not in name and (name.endswith('bias') or 'layer_norm' in name):
        p.add_(0.1 * torch.randn_like(p))
    model.final_logits_bias.add_(0.2 * torch.randn_like(model.final_logits_bias))
  model.save_pretrained(directory)
  return directory


def opus_layout(exported: str, directory: str) -> str:
  """A MarianMTModel this project exported (pad 0, EOS 1, unk 2), renumbered as OPUS-MT
  numbers its tokens (EOS 0, unk 1, pad last, the decoder starting from pad): the same
  trained translation model, its rows and vocab.json rotated."""
  import shutil  # pylint: disable=import-outside-toplevel

  import torch  # pylint: disable=import-outside-toplevel
  from transformers import MarianMTModel  # pylint: disable=import-outside-toplevel
  shutil.copytree(exported, directory)
  model = MarianMTModel.from_pretrained(exported).eval()
  size = model.config.vocab_size
  old = (np.arange(size) + 1) % size  # new id j is old id j + 1; old 0 (pad) is the last
  with torch.no_grad():
    model.model.shared.weight.copy_(model.model.shared.weight[old])
    model.final_logits_bias.copy_(model.final_logits_bias[:, old])
  model.config.update(dict(pad_token_id=size - 1, decoder_start_token_id=size - 1,
                           eos_token_id=0))
  model.generation_config.update(pad_token_id=size - 1, decoder_start_token_id=size - 1,
                                 eos_token_id=0, suppress_tokens=[size - 1])
  model.save_pretrained(directory)
  with open(os.path.join(directory, 'vocab.json')) as f:
    vocab = json.load(f)
  with open(os.path.join(directory, 'vocab.json'), 'w') as f:
    json.dump({piece: (i - 1) % size for piece, i in vocab.items()}, f)
  for name in ('tokenizer_config.json', 'special_tokens_map.json'):  # their ids are the old
    if os.path.exists(os.path.join(directory, name)):
      os.remove(os.path.join(directory, name))
  from transformers import MarianTokenizer  # pylint: disable=import-outside-toplevel
  paths = [os.path.join(directory, name) for name in ('source.spm', 'target.spm', 'vocab.json')]
  MarianTokenizer(*paths).save_pretrained(directory)
  return directory


def gpt2(directory: str, **config) -> str:
  """A GPT-2: byte-level BPE of 400 ids trained on Tiny Shakespeare (<|endoftext|> last, as
  GPT-2's 50256), pre-LN, learned positions, gelu_new, tied output."""
  import torch  # pylint: disable=import-outside-toplevel
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # pylint: disable=import-outside-toplevel
  from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast  # pylint: disable=import-outside-toplevel
  os.makedirs(directory, exist_ok=True)
  bpe = Tokenizer(models.BPE())
  bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  bpe.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=399, show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  bpe.train_from_iterator(shakespeare().splitlines()[:6000], trainer)
  bpe.add_special_tokens(['<|endoftext|>'])
  tokenizer = GPT2TokenizerFast(tokenizer_object=bpe, bos_token='<|endoftext|>',
                                eos_token='<|endoftext|>', unk_token='<|endoftext|>')
  tokenizer.save_pretrained(directory)
  end = bpe.token_to_id('<|endoftext|>')
  fields = dict(vocab_size=bpe.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2, n_head=4,
                bos_token_id=end, eos_token_id=end, activation_function='gelu_new')
  fields.update(config)
  torch.manual_seed(0)
  model = GPT2LMHeadModel(GPT2Config(**fields)).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith('bias') or '.ln_' in name:
        p.add_(0.1 * torch.randn_like(p))
    model.transformer.wte.weight.mul_(10.0)  # peakier logits: clear greedy choices
  model.save_pretrained(directory)
  return directory


def bert(directory: str, **config) -> str:
  """A BERT encoder with a WordPiece vocabulary trained on Multi30k English."""
  import torch  # pylint: disable=import-outside-toplevel
  from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers  # pylint: disable=import-outside-toplevel
  from transformers import BertConfig, BertModel, BertTokenizerFast  # pylint: disable=import-outside-toplevel
  os.makedirs(directory, exist_ok=True)
  wordpiece = Tokenizer(models.WordPiece(unk_token='[UNK]'))
  wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
  wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  trainer = trainers.WordPieceTrainer(vocab_size=300, show_progress=False, special_tokens=[
      '[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'])
  wordpiece.train_from_iterator(multi30k('train', 'en', 3000), trainer)
  cls, sep = wordpiece.token_to_id('[CLS]'), wordpiece.token_to_id('[SEP]')
  wordpiece.post_processor = processors.TemplateProcessing(
      single='[CLS] $A [SEP]', pair='[CLS] $A [SEP] $B:1 [SEP]:1',
      special_tokens=[('[CLS]', cls), ('[SEP]', sep)])
  BertTokenizerFast(tokenizer_object=wordpiece).save_pretrained(directory)
  fields = dict(vocab_size=wordpiece.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
                pad_token_id=0)
  fields.update(config)
  torch.manual_seed(0)
  model = BertModel(BertConfig(**fields)).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith('bias') or 'LayerNorm' in name:
        p.add_(0.1 * torch.randn_like(p))
  model.save_pretrained(directory)
  return directory
