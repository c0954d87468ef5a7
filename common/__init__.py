"""The bottom layer: small utilities every package may use (`model`, `input_pipeline`,
`training`, `inference`, `hf_export`, the command lines). It imports no other package.

  atomic_file   the one way to write: atomic_write(path, data) for the project's own files;
                check_destination, OutputFile, write_output, make_output_dir, OutputLock for
                the commands' outputs (no symlink/FIFO/device/workdir file, temp + rename,
                one writer at a time, a killed writer's leftovers removed by the next, a
                full disk in one line)
  dtype_limits  INT32_MAX, UINT32_MAX, FLOAT32_MAX, FLOAT32_TINY: what numbers are checked against
  tokens        PAD_ID, EOS_ID, UNK_ID and `truncate` (a cut sequence keeps its EOS)
  messages      first_few(items): "a; b; c (+N more)" for one-line errors
  errors        ConfigError, the one error for a bad configuration value
  schema        a config section's base: documented fields, from_config, 'did you mean'
  lock_file     open_lock_file(path): a lock file opened without following a symlink
  interrupts    stop_on_signals() / check(): Ctrl-C and SIGTERM as one request to stop, kept
                when Python drops the KeyboardInterrupt (a gc callback)
  files         open_regular / read_regular(path): a regular file only, never waiting on a FIFO;
                inside(path, directory): by device and inode (symlinks, bind mounts)
  accelerator   matmul precision and deterministic ops (GPU/TPU), for training and decoding
  scores        BLEU, lowercased BLEU and chrF2 with sacreBLEU, with their signatures
"""
