"""The config's and train.py's numbers: each is range-checked in the type it is used in
(float32, int32, a uint32 seed), in one line naming the field."""

import pytest

from tests.training import test_train_synthetic as syn
from training import config_check
from workdir import config_io


@pytest.mark.parametrize('field,value,message', [
    # finite in float64, inf in float32
    ('optimizer.learning_rate', 1e308, 'config.optimizer.learning_rate=1e+308 must be a finite '
                                       'number (as a float32: at most 3.403e+38 in magnitude)'),
    ('model.dropout_rate', 1e39, 'config.model.dropout_rate=1e+39 must be a finite number'),
    ('optimizer.weight_decay', -1e300, 'config.optimizer.weight_decay=-1e+300 must be a finite'),
    # 0 in float32 (or a subnormal, flushed to 0)
    ('optimizer.eps', 1e-50, 'config.optimizer.eps=1e-50 must be at least 1.175e-38'),
    ('optimizer.eps', 1e-40, 'config.optimizer.eps=1e-40 must be at least 1.175e-38'),
    ('optimizer.learning_rate', 1e-45, 'config.optimizer.learning_rate=1e-45 must be a positive'),
    # below 1 in float64, 1 in float32
    ('optimizer.b2', 1 - 1e-9, 'config.optimizer.b2=0.999999999 must be in [0, 1)'),
    ('train.label_smoothing', 1 - 1e-10, 'config.train.label_smoothing=0.9999999999 must be in'),
    # decoding computes in float32
    ('decode.alpha', 1e308, 'config.decode.alpha=1e+308 must be a finite number'),
    ('decode.alpha', 30.0, 'config.decode.alpha=30.0 must be a number in [0, 10]'),
    ('decode.temperature', 1e-30, 'config.decode.temperature=1e-30 must be 0 (greedy) or a number '
                                                'in [0.001, 1000]'),
    # ints: int32 steps, sizes and indices; a uint32 seed
    ('train.num_steps', 99999999999999999999, 'config.train.num_steps=99999999999999999999 is '
                                              'out of range: at most 2147483647 (an int32)'),
    ('train.batch_size', 2**31, 'config.train.batch_size=2147483648 is out of range'),
    ('data.max_length', 2**40, 'config.data.max_length=1099511627776 is out of range'),
    ('decode.beam_size', 5000, 'config.decode.beam_size=5000 must be an integer in [1, 1024]'),
    # int32-valid sizes whose tables could not be allocated (issue 45 item 16)
    ('model.max_len', 2**30, 'config.model.max_len=1073741824 x d_model='),
    ('model.vocab_size', 2**30, 'config.model.vocab_size=1073741824 x d_model='),
    ('train.seed', 2**32, 'config.train.seed=4294967296 must be an integer in [0, 4294967295]'),
    ('train.seed', -1, 'config.train.seed=-1 must be an integer in [0, 4294967295]'),
])
def test_numbers_are_checked_in_the_type_they_are_used_in(field, value, message):
  config = syn.tiny_config('encoder_decoder', **{field: value})
  with pytest.raises(config_io.ConfigError) as e:
    config_check.validate_config(config)
  assert str(e.value).startswith(message), str(e.value)


@pytest.mark.parametrize('field,value', [
    ('train.seed', 2**32 - 1), ('optimizer.eps', 1.2e-38), ('optimizer.b2', 0.9999),
    ('decode.alpha', 10.0), ('decode.temperature', 0.0), ('train.num_steps', 2**31 - 1)])
def test_the_edges_of_the_ranges_are_accepted(field, value):
  config_check.validate_config(syn.tiny_config('encoder_decoder', **{field: value}))


# train.py's own int flags (--num_processes, --process_id) refused in one line: in
# test_train_cli's BAD_CONFIGS, which runs train.py's command lines in one interpreter; a
# float out of float32's range through train.py is the first case above, in-process (the way
# through train.py is BAD_CONFIGS' learning_rate=inf's).
