"""Exports of a trained workdir to other engines: Hugging Face `transformers` and CTranslate2.

  transformers (`--format=transformers`, the default):
    encoder_decoder, post-LN  -> MarianMTModel               + MarianTokenizer (sentencepiece)
    encoder_decoder, pre-LN   -> PegasusForConditionalGeneration + MarianTokenizer
    decoder_only,    pre-LN   -> GPT2LMHeadModel             + a character PreTrainedTokenizerFast
    encoder_only,    post-LN  -> BertModel                   + its imported tokenizer.json
  CTranslate2 (`--format=ctranslate2`): a TransformerSpec (Translator) or a
    TransformerDecoderModelSpec (Generator) written from our parameters (`ctranslate2`).

`targets` is the table of transformers classes, `convert` the pure weight/config conversion,
`tokenizer` the tokenizer files, `output_dir` where an export may be written (never into the
workdir; --overwrite replaces only a previous export), `writer` the workdir -> directory
export behind `export.py`.
"""

from hf_export.output_dir import ExportError
from hf_export.targets import UnsupportedConfig, check_exportable, target_class
from hf_export.writer import export_workdir

__all__ = ['ExportError', 'UnsupportedConfig', 'check_exportable', 'export_workdir',
           'target_class']
