"""Hugging Face `transformers` export: a trained workdir -> a directory `from_pretrained` loads.

  encoder_decoder, post-LN  -> MarianMTModel               + MarianTokenizer (sentencepiece)
  encoder_decoder, pre-LN   -> PegasusForConditionalGeneration + MarianTokenizer
  decoder_only,    pre-LN   -> GPT2LMHeadModel             + a character PreTrainedTokenizerFast

`targets` is the table of target classes, `convert` the pure weight/config conversion,
`tokenizer` the tokenizer files, `writer` the workdir -> directory export behind `export.py`.
"""

from hf_export.targets import UnsupportedConfig, check_exportable, target_class
from hf_export.writer import ExportError, export_workdir

__all__ = ['ExportError', 'UnsupportedConfig', 'check_exportable', 'export_workdir',
           'target_class']
