# Shared by fault_test.sh and fault_campaign.sh (sourced, with $mt the minitrain binary and $work a
# scratch directory): the corpus both train on, the run options they share, and how a run is compared
# with the uninterrupted reference (its newest checkpoint exported, and the loss of every step).

# Writes $work/corpus.txt, prepares it into $work/data and sets `common`, the options of every run;
# extra arguments (a layout) are appended to it. Exits with a FAIL line if prepare fails.
fault_setup() {
  for i in $(seq 1 300); do printf 'fault %d tolerance %d needs %d checkpoints.\n%%\n' "$i" $((i * 7 % 13)) $((i % 5)); done \
    > "$work/corpus.txt"
  "$mt" data prepare --input "$work/corpus.txt" --out "$work/data" --splitter fortune --vocab 300 >/dev/null 2>&1 \
    || { echo "FAIL data prepare"; exit 1; }
  common=(model=tiny model.vocab_size=300 model.n_layer=2 model.n_embd=32 model.n_head=4 model.block_size=32
          seq_len=32 batch_size=2 steps=8 save_every=2 data.path="$work/data" data.mode=shuffled threads=1
          log_every=100 --zero 1 "$@")
}

final_state() {  # <run dir>: exports its newest checkpoint (params + moments) to <run dir>/final.safetensors
  "$mt" ckpt export "$1/checkpoints/latest" "$1/final.safetensors" --all >/dev/null 2>&1
}

losses() {  # <metrics.jsonl>: the last record of each step, "step loss" per line
  /usr/bin/python3 -c 'import json,sys
last={}
for l in open(sys.argv[1]):
    j=json.loads(l)
    if "loss" in j: last[j["step"]]=repr(j["loss"])
for s in sorted(last): print(s, last[s])' "$1"
}
