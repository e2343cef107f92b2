"""`tfjax-prepare` / `python -m tfjax.data.prepare`: the command line of tfjax/data/prepare.py
(flags, one `error:` line with exit 2 for bad input, the summary line)."""

from __future__ import annotations

import argparse
import os
import sys

from tfjax.data import prepare as prepare_lib
from tfjax.data import prepare_media


class _Parser(argparse.ArgumentParser):
  def error(self, message):
    _fail(f"{message} (see {self.prog} --help)")


def _bool(text: str) -> bool:
  if text.lower() in ("1", "true", "yes"):
    return True
  if text.lower() in ("0", "false", "no"):
    return False
  raise argparse.ArgumentTypeError(f"{text!r} is not a boolean (true or false)")


def parse_args(argv):
  p = _Parser(prog="tfjax-prepare", description=prepare_lib.__doc__.splitlines()[0],
              formatter_class=lambda prog: argparse.HelpFormatter(
                  prog, max_help_position=60, width=100_000))
  p.add_argument("--input", required=True,
                 help="comma-separated .txt/.jsonl[.gz|.zst]/.parquet files or globs, or a "
                      "`datasets` save_to_disk directory; or images:DIR (one subfolder per "
                      "class) or audio:DIR (NAME.wav + NAME.txt), see docs/data.md")
  p.add_argument("--tokenizer", default=None, help="gpt2 | bpe:DIR | hf:DIR | byte | char "
                 "(text and audio inputs)")
  p.add_argument("--output", required=True, help="the prepared directory to write")
  p.add_argument("--text_field", default="text", help="the text field of JSONL / column of "
                 "Parquet and datasets")
  p.add_argument("--workers", type=int, default=None, help="tokenizing processes (default: "
                 "one per CPU core)")
  p.add_argument("--val_fraction", type=float, default=0.0005, help="fraction of the documents "
                 "in the val split (nanoGPT's OpenWebText split)")
  p.add_argument("--val_docs", type=int, default=None, help="instead: the first N documents")
  p.add_argument("--min_val_tokens", type=int, default=prepare_lib.MIN_VAL_TOKENS,
                 help="the val split holds at least this many tokens: with --val_fraction the "
                      "leading documents that hold them join it; too few --val_docs, or a corpus "
                      "too small for it, is an error (default %(default)s = 8 windows of 1,025 "
                      "tokens, for data.seq_len <= 1024; use >= 8 x (data.seq_len + 1) for longer "
                      "rows; 0: no minimum)")
  p.add_argument("--overwrite", action="store_true",
                 help="replace an earlier prepare in --output (it is kept until the new one is "
                      "finished; without this flag it is never touched)")
  p.add_argument("--shard_mb", type=float, default=64.0,
                 help="text megabytes per shard (at most 2 x workers shards of text are in "
                      "memory at once)")
  p.add_argument("--dtype", default="auto", help="auto | uint16 | uint32")
  p.add_argument("--bad_utf8", default="replace", help="bytes that are not UTF-8: replace | "
                 "skip (the document) | error")
  p.add_argument("--txt_docs", default="paragraphs", help=".txt documents: paragraphs (split "
                 "at blank lines) | file")
  p.add_argument("--append_eos", default=True, type=_bool,
                 help="end each document with the tokenizer's end-of-text id, when it has one")
  p.add_argument("--progress", default=True, type=_bool,
                 help="show a progress bar")
  media = p.add_argument_group("image and audio folders (tfjax/data/prepare_media.py)")
  media.add_argument("--val_input", default=None, help="images:DIR / audio:DIR: a held-out "
                     "folder for the val split (instead of --val_fraction)")
  media.add_argument("--image_size", type=int, default=224, help="images: shorter side resized "
                     "to this, then center-cropped to a square")
  media.add_argument("--image_mode", default="RGB", help="images: RGB | L (grayscale)")
  media.add_argument("--n_mels", type=int, default=80, help="audio: Whisper mel bins, 80 | 128")
  media.add_argument("--chunk_seconds", type=int, default=30, help="audio: features of this many "
                     "seconds (Whisper's 30 = 3,000 frames); a longer clip is an error")
  return p.parse_args(argv)


def _fail(message: str):
  # tfjax.training.entry.cli's convention (one `error:` line, exit 2); tfjax.data sits below
  # training.
  print("error: " + " ".join(str(message).split()), file=sys.stderr)
  sys.exit(prepare_lib.USAGE_ERROR)


def _fail_on(e: Exception):
  if os.environ.get("TFJAX_TRACEBACK", "") not in ("", "0"):
    raise e
  _fail(str(e) if not isinstance(e, OSError) or not e.filename else
        (f"{e.filename}: {e.strerror}" if e.strerror else str(e)))


def _main_media(args) -> None:
  try:
    manifest = prepare_media.prepare_media(
        args.input, args.output, val_input=args.val_input, val_fraction=args.val_fraction,
        val_docs=args.val_docs, tokenizer=args.tokenizer, image_size=args.image_size,
        image_mode=args.image_mode, n_mels=args.n_mels, chunk_seconds=args.chunk_seconds,
        shard_mb=args.shard_mb, dtype=args.dtype, append_eos=args.append_eos,
        workers=args.workers, overwrite=args.overwrite)
  except (ValueError, FileNotFoundError, NotADirectoryError) as e:
    _fail_on(e)
  train, val = manifest["splits"]["train"], manifest["splits"]["val"]
  what = (f"{len(manifest['class_names'])} classes, {manifest['settings']['size']}px "
          f"{manifest['settings']['mode']}" if manifest["kind"] == "image" else
          f"{manifest['settings']['n_mels']} mel bins x {manifest['settings']['frames']} frames, "
          f"tokenizer {manifest['tokenizer']['name']} "
          f"({manifest['tokenizer']['vocab_size']:,} ids)")
  print(f"{args.output}: {manifest['kind']} train {train['num_examples']:,} examples in "
        f"{len(train['shards'])} shards, val {val['num_examples']:,}; {what}; skipped files: "
        f"{manifest['skipped_files']}")


def main(argv=None) -> None:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  if prepare_media.media_kind(args.input):
    _main_media(args)
    return
  if args.tokenizer is None:
    _fail("the following arguments are required: --tokenizer (see tfjax-prepare --help)")
  try:
    manifest = prepare_lib.prepare(
        args.input, args.tokenizer, args.output, text_field=args.text_field,
        workers=args.workers, val_fraction=args.val_fraction, val_docs=args.val_docs,
        shard_mb=args.shard_mb, dtype=args.dtype, bad_utf8=args.bad_utf8, txt_docs=args.txt_docs,
        append_eos=args.append_eos, progress=args.progress,
        min_val_tokens=args.min_val_tokens, overwrite=args.overwrite)
  except (ValueError, FileNotFoundError, NotADirectoryError) as e:
    _fail_on(e)
  train, val = manifest["splits"]["train"], manifest["splits"]["val"]
  print(f"{args.output}: train {train['num_tokens']:,} tokens / {train['num_docs']:,} documents "
        f"in {len(train['shards'])} shards, val {val['num_tokens']:,} / {val['num_docs']:,}; "
        f"{manifest['dtype']}, tokenizer {manifest['tokenizer']['name']} "
        f"({manifest['tokenizer']['vocab_size']:,} ids); non-UTF-8 documents: "
        f"{manifest['bad_utf8']['documents']} ({manifest['bad_utf8']['policy']})")


if __name__ == "__main__":
  main()
