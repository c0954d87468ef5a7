"""Moved to `autoregressive.decoding` (the search over the KV cache); this name is the
public contract (`model.decoding.greedy_decode`, ...) and keeps working."""

from autoregressive.decoding import (  # noqa: F401
                                EOS_ID,
                                PAD_ID,
                                beam_search_decode,
                                greedy_decode,
                                length_penalty,
                                sample,
                                sequence_log_probs,
)

__all__ = ['greedy_decode', 'sample', 'beam_search_decode', 'sequence_log_probs',
           'length_penalty', 'PAD_ID', 'EOS_ID']
