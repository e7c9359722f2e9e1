#!/usr/bin/env bash
# The GPU checks behind benchmarks/results/, one stage per argument, for a machine without internet:
#   bash benchmarks/run_checks.sh OUT_DIR STAGE...
# Needs .whl/ (timm, einops, diffusers, torch-fidelity, fla-core wheels; scripts/device_env.sh installs them) and, for
# the CIFAR-10 stages, .carry/cifar10-{train,test}-jpg.tar.gz (copies of ../shared/data/cifar10).
# Stages (each writes its JSON and log under OUT_DIR):
#   kernels      the Triton kernels against the fp64 references (LION: seven processes with disjoint case sets, merged
#                into lion_check.json; most of its time is Triton compilation on a cold cache)
#   models2gpu   classify + diffusion CIFAR-10 comparisons, on GPU 0 and GPU 1 at the same time (about 8 min)
#   classify_table  the CIFAR-10 classification table: LV_NAMES (default softmax lightnet lion_d lion_s lion_s_snake;
#                names of configs/variants/classify_cifar10.yaml too) trained LV_EPOCHS (default: the recipe's 200)
#                epochs side by side, spread over the GPUs (scripts/run_variants.py --family classify, CUDA MPS), with
#                the fast path (data.pipeline=gpu data.cache=device, compiled with CUDA graphs) and LV_SET recipe
#                overrides for all, LV_TAG the report's name (default deit_t_patch4_<epochs>epochs), then the plot
#                (scripts/plot_classify.py); five 200-epoch runs took 15-19 min on two H200s
#   resolution   transfer to other image sizes, three groups at once over the first four GPUs (CUDA MPS): the CIFAR-10
#                table (softmax, LightNet, LION-D / S / snake, the LION ones with the mean of every token and with the
#                cls token, LV_EPOCHS default 200; LV_TABLE_NAMES, LV_TABLE_GPUS and LV_TABLE_TAG choose other names,
#                GPUs and report name) evaluated at 16-96 px in every position setting (units, decay powers, one
#                signal group in token units); the training
#                switches (aug.sizes, aug.scale) against the plain recipe for every attention (LV_SCREEN_EPOCHS,
#                default 15); LightNet-DiT and DiT-S/2 per attention (LV_DIT_STEPS, default 2500) sampled at 32 / 48 /
#                64 px in image and token units; LV_GROUPS (default "table screen dit") picks the groups
#   multigpu     1 vs 2 GPU training, evaluation and sampling (scripts/multi_gpu_check.py)
#   speed        attention cores (Figure 2 of LightNet), whole models and a profile of a DeiT-S step (scripts/bench_attention.py,
#                plot_attention.py, bench_models.py, profile_model.py)
#   block_speed  whole models against softmax, about 7 min on one H100: the GPU tests of the fused block kernels and
#                of what the blocks rebuild in the backward (tests/kernels/test_fused_kernel.py -k of the kernels the
#                blocks use, tests/ops/test_ops_recompute.py, the DiT kernel, rebuild and dtype tests), then
#                bench_models.py side by side in one process per group, training images/s and peak memory with their
#                ratio to softmax: DiT-B/2 at 256 / 512 px (softmax, lightnet, lion_s, lightnet_b_head64: 12 heads of
#                64) eager; DeiT-S compiled
#                (reduce-overhead) at 224 (softmax, lightnet, lion_s) and 1024 (softmax, lightnet); then
#                profile_model.py's split of a step (matrix work, attention core, the rest by op) for DiT-B/2 at 256 /
#                512 and DeiT-S at 224, eager, and DeiT-S at 224 compiled. LV_BLOCK_FULL=1 adds DiT-B/2 compiled
#                (reduce-overhead, training only) at 256 / 512, benchmark and profiles (six compiles each, about 10 min
#                more). Ends with both tables (block_speed.md); JSON: block_models_*.json, block_profile_*.json
#   memory       DeiT-S inference memory at batch 8 from 224 to 1024 px, every attention, and its growth exponent with
#                the token count (bench_models.py --memory-only; a minute or two)
#   input        the classifier input pipeline: first the gpu pipeline's tests on the GPU (its ops against timm's, no
#                host synchronisation under set_sync_debug_mode, graph replay equal to the ops, the RandAugment layer,
#                resize and normalise-erase-mix programs against their PyTorch references), then an ImageNet-like
#                JPEG folder (scripts/make_imagenet_like.py, 12,000 images from the CIFAR-10 archives in .carry/) and
#                DeiT-S training images/s through `classify train` (one pinned process per setting) against synthetic
#                input for 4 / 8 / 16 loader cores,
#                folder / shards / shards --max-size 256, gpu (graph-replayed augmentation) / cpu pipelines, and the
#                folder decoded once into device memory (the Trainer's own ceiling with the augmentation)
#                (scripts/bench_input.py; needs the webdataset and braceexpand wheels; no new setting starts after
#                10 min), then where one batch's decode and augmentation time goes (scripts/profile_input.py); about
#                12 min in all (run it detached past one call's limit)
#   tests        the kernel, op and layer tests on the GPU (pytest tests/kernels tests/ops tests/layers; LV_TESTS_K
#                narrows them with -k), and the host-synchronisation checks of the training step and the diffusion
#                loss and samplers (tests/engine/test_engine_guards.py, tests/diffusion/test_gaussian.py)
#   dit_curves   FID / precision / recall (yardstick features) and test bits/dim against training steps (LightNet
#                Table 10 / Figure 4 in miniature): LV_NAMES (default softmax lightnet lion_s; names of
#                configs/variants/diffusion_cifar10.yaml too) at size LV_SIZE (default b; s) trained LV_STEPS (default
#                20000) steps with LV_RECIPE (default configs/diffusion/cifar10_paper.yaml, LightNet's optimiser),
#                evaluated every LV_EVAL_EVERY (default 2000) steps on LV_EVAL_SAMPLES (default 2000) samples of
#                LV_SAMPLE_STEPS (default 50) DDIM steps and LV_BPD_IMAGES (default 1000) test images (bits/dim also
#                split into LV_BPD_BUCKETS, default 4, ranges of t), side by side over the visible GPUs
#                (scripts/run_variants.py, CUDA MPS; LV_PROCS "NAME=K ..." trains NAME data-parallel on K GPUs of its
#                own, e.g. LV_PROCS=lightnet=2 on four GPUs; LV_MPS=0 leaves MPS off when each GPU runs one process),
#                checkpointing every LV_CKPT_EVERY (default 500) steps into
#                LV_WORK (default /tmp/lightvision_dit_curves_<size>; reports and logs too). After LV_STOP_AFTER
#                seconds (default 400; 0: never) every run checkpoints and stops: the same command resumes them
#                (finished runs are kept). Then OUT/dit_curves_<size>/dit_curves_<size>.{json,png}
#                (scripts/plot_dit_curves.py; unfinished runs included from their run folders; LV_PREVIOUS: curve
#                files under benchmarks/results/ whose runs join the plot, e.g. a softmax curve of an earlier call)
#                beside the report and logs; LV_SET adds recipe overrides for all (LV_SET='train.compile=true
#                train.compile_mode=reduce-overhead': CUDA graphs, 2.4x the steps/s of compile's default mode for
#                LightNet-DiT-B/2 data-parallel on two GPUs)
#   variants     LightNet-DiT-S/2 variants (configs/variants/diffusion_cifar10.yaml) and attention kinds trained side by
#                side on one GPU (scripts/run_variants.py, CUDA MPS when its daemon starts): LV_NAMES in priority
#                order, LV_STEPS, LV_DEADLINE (seconds; the last-listed runs are stopped to meet it), LV_TAG,
#                LV_EVAL_SECONDS (expected evaluation time) and LV_BENCH_ARGS for every run (e.g. "--no-fid
#                --samples 1000 --sample-steps 50"); PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and at most
#                about six DiT-S/2 runs at batch 128 share an 80 GB GPU
set -u
out="$(realpath -m "$1")"; shift
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$out"
source "$repo/scripts/device_env.sh" || exit 1
if [ -d "$repo/.carry" ] && [ ! -d /tmp/cifar/test ]; then
  mkdir -p /tmp/cifar && for s in train test; do tar -xzf "$repo/.carry/cifar10-$s-jpg.tar.gz" -C /tmp/cifar; done
fi
cd /tmp  # not the checkout root: its lightvision/ would shadow the package tree of device_env.sh
stamp() { echo "[$(date -u +%H:%M:%S)] $*"; }
# One CUDA MPS daemon for the whole machine: started outside this stage's CUDA_VISIBLE_DEVICES, since clients number
# their GPUs within the daemon's, and a daemon started with one GPU visible fails every client of another GPU
start_mps() { env -u CUDA_VISIBLE_DEVICES nvidia-cuda-mps-control -d > /dev/null 2>&1 && stamp "CUDA MPS daemon started"; }

for stage in "$@"; do
  stamp "stage $stage"
  case "$stage" in
    models2gpu)
      (CUDA_VISIBLE_DEVICES=0 python3 -m lightvision.classify.benchmark softmax lightnet lion_d lion_s lion_s_snake \
         --data /tmp/cifar --out "$out" --epochs 4 --warmup-epochs 1 --workers 12 > "$out/classify.log" 2>&1; stamp "classify done rc=$?") &
      (CUDA_VISIBLE_DEVICES=1 python3 -m lightvision.diffusion.benchmark softmax lightnet lion_s --data /tmp/cifar \
         --out "$out" --steps 800 --batch-size 128 --bpd-images 1000 --samples 2000 \
         --sample-steps 50 --sample-batch 500 > "$out/diffusion.log" 2>&1; stamp "diffusion done rc=$?") &
      wait
      grep -A 12 "^| attention" "$out/classify.log"
      grep -E '"(test_bits_per_dim|fid|precision|recall|train_steps_per_s|error)"' "$out/diffusion.log"
      ;;
    classify_table)
      start_mps
      tag="${LV_TAG:-deit_t_patch4_${LV_EPOCHS:-200}epochs}"
      python3 "$repo/scripts/run_variants.py" --family classify ${LV_NAMES:-softmax lightnet lion_d lion_s lion_s_snake} \
        --data /tmp/cifar --out "$out" --work /tmp/lightvision_classify_table --tag "$tag" --workers 5 \
        --variants "$repo/configs/variants/classify_cifar10.yaml" -- ${LV_EPOCHS:+--epochs "$LV_EPOCHS"} \
        --set train.compile=true train.compile_mode=reduce-overhead data.pipeline=gpu data.cache=device ${LV_SET:-} \
        > "$out/classify_table.log" 2>&1; stamp "classify table done rc=$?"
      python3 "$repo/scripts/plot_classify.py" "$out/classify_cifar10_$tag.json" --out "$out/classify_cifar10_$tag.png"
      tail -n 8 "$out/classify_table.log"
      ;;
    kernels)
      for sizes in 50 197 221 577 1024 4096 0; do  # disjoint shards in parallel (0: the snake and two-scan cases)
        extras=$([ "$sizes" = 0 ] || echo --no-extras)
        python3 "$repo/scripts/lion_check.py" --sizes "$sizes" $extras --out "$out/lion_check_$sizes.json" \
          > "$out/lion_check_$sizes.log" 2>&1 &
      done
      wait; stamp "lion check shards done"
      python3 - "$out" <<'MERGE'
import glob, json, sys
parts = sorted(glob.glob(f"{sys.argv[1]}/lion_check_*.json"))
if not parts:
    sys.exit("lion check: no shard wrote its results (see lion_check_*.log)")
merged = json.load(open(parts[0]))
merged["checks"] = [c for p in parts for c in json.load(open(p))["checks"]]
merged["env"]["command"] = "bash benchmarks/run_checks.sh OUT kernels (python scripts/lion_check.py --sizes S, one process per S in 50 197 221 577 1024 4096 and 0 = the snake and two-scan cases)"
json.dump(merged, open(f"{sys.argv[1]}/lion_check.json", "w"), indent=1)
failed = sum(not c["ok"] for c in merged["checks"])
print(f"lion check: {len(merged['checks']) - failed} / {len(merged['checks'])} passed from {len(parts)} shards")
MERGE
      python3 "$repo/scripts/bench_attention.py" --check --ops lightnet --impls triton --shapes 196x256 --modes fwd \
        --out "$out/lightnet_check.json" > "$out/lightnet_check.log" 2>&1; stamp "lightnet check done rc=$?"
      tail -n 2 "$out/lightnet_check.log"
      ;;
    multigpu)
      python3 "$repo/scripts/multi_gpu_check.py" --data /tmp/cifar --out "$out/multi_gpu.json" > "$out/multi_gpu.log" 2>&1
      stamp "multi-gpu check done rc=$?"; tar czf "$out/multi_gpu_logs.tgz" -C /tmp/multi_gpu_check logs; tail -n 30 "$out/multi_gpu.log"
      ;;
    speed)
      python3 "$repo/scripts/bench_attention.py" --ops softmax,lightnet,lion_d,lion_s \
        --impls sdpa,torch,triton,torch_mask,triton_parallel,triton_scan,auto,fla --out "$out/attention.json" \
        > "$out/attention.log" 2>&1; stamp "attention done rc=$?"
      python3 "$repo/scripts/bench_models.py" --warmup 2 --steps 6 --dit-sizes b --memory-batch 2 --out "$out/models.json" \
        > "$out/models.log" 2>&1; stamp "models done rc=$?"
      python3 "$repo/scripts/profile_model.py" --attentions softmax lightnet --out "$out/profile.json" \
        > "$out/profile.log" 2>&1; stamp "profile done rc=$?"
      python3 "$repo/scripts/plot_attention.py" "$out/attention.json" --out "$out/attention_vs_length" > /dev/null
      tail -n 30 "$out/attention.log"; tail -n 60 "$out/models.log"
      ;;
    block_speed)
      (cd "$repo" && pytest -q -p no:cacheprovider tests/kernels/test_fused_kernel.py tests/ops/test_ops_recompute.py \
        tests/diffusion/test_dit.py -k "rms or silu or glu or adaln or gated or compile or recompute or rebuilt or ffn \
        or keeps or plain or matches or residual_stream" > "$out/block_speed_tests.log" 2>&1); stamp "block tests done rc=$?"
      tail -n 3 "$out/block_speed_tests.log"
      bench() { python3 "$repo/scripts/bench_models.py" --warmup 3 --steps 8 "$@"; }
      bench --family dit --dit-sizes b --sizes 256 512 --attentions softmax lightnet lion_s lightnet_b_head64 \
        --out "$out/block_models_dit_eager.json" > "$out/block_models_dit_eager.log" 2>&1; stamp "DiT eager done rc=$?"
      if [ -n "${LV_BLOCK_FULL:-}" ]; then
        bench --family dit --dit-sizes b --sizes 256 512 --attentions softmax lightnet lion_s lightnet_b_head64 --train-only \
          --compile reduce-overhead --out "$out/block_models_dit_compiled.json" > "$out/block_models_dit_compiled.log" 2>&1
        stamp "DiT compiled done rc=$?"
      fi
      bench --family deit --sizes 224 --attentions softmax lightnet lion_s --train-only --compile reduce-overhead \
        --out "$out/block_models_deit_224.json" > "$out/block_models_deit_224.log" 2>&1; stamp "DeiT 224 done rc=$?"
      bench --family deit --sizes 1024 --attentions softmax lightnet --train-only --compile reduce-overhead \
        --out "$out/block_models_deit_1024.json" > "$out/block_models_deit_1024.log" 2>&1; stamp "DeiT 1024 done rc=$?"
      profile() { python3 "$repo/scripts/profile_model.py" --attentions softmax lightnet lion_s --top 15 "$@"; }
      profile --cases dit_b:256 dit_b:512 deit_s:224 --out "$out/block_profile_eager.json" \
        > "$out/block_profile_eager.log" 2>&1; stamp "eager profiles done rc=$?"
      profile --cases deit_s:224 ${LV_BLOCK_FULL:+dit_b:256 dit_b:512} --compile reduce-overhead \
        --out "$out/block_profile_compiled.json" > "$out/block_profile_compiled.log" 2>&1; stamp "compiled profiles done rc=$?"
      python3 - "$out" <<'SUMMARY' | tee "$out/block_speed.md"
import glob, json, sys
from lightvision.tools.speed_tables import ratio_table, ratios, split_table, train_table
records = [r for p in sorted(glob.glob(f"{sys.argv[1]}/block_models_*.json")) for r in json.load(open(p))["records"]]
profiles = [r for p in sorted(glob.glob(f"{sys.argv[1]}/block_profile_*.json")) for r in json.load(open(p))["profiles"]]
train = [r for r in records if r["mode"] == "train"]
print(train_table(train) + "\n\nAgainst softmax:\n\n" + ratio_table(ratios(train)))
print("\nWhere a step's GPU time goes (ms per step):\n\n" + split_table(profiles))
SUMMARY
      ;;
    memory)
      python3 "$repo/scripts/bench_models.py" --family deit --memory-only --out "$out/models_memory.json" \
        > "$out/models_memory.log" 2>&1; stamp "memory done rc=$?"
      tail -n 12 "$out/models_memory.log"
      ;;
    input)
      (cd "$repo" && pytest -q -p no:cacheprovider tests/classify/test_device_pipeline.py \
        tests/kernels/test_augment_kernel.py tests/kernels/test_resize_kernel.py tests/kernels/test_erase_kernel.py \
        tests/kernels/test_mix_kernel.py > "$out/input_tests.log" 2>&1)
      stamp "input tests done rc=$?"; tail -n 3 "$out/input_tests.log"
      python3 "$repo/scripts/make_imagenet_like.py" --cifar "$repo/.carry" --out /tmp/imagenet_like --count 12000 \
        > "$out/make_imagenet_like.log" 2>&1; stamp "imagenet-like folder done rc=$?"
      python3 "$repo/scripts/bench_input.py" --data /tmp/imagenet_like --out "$out/input.json" --cores 4 8 16 \
        --max-size 256 --budget-s 600 > "$out/input.log" 2>&1
      stamp "input done rc=$?"
      python3 "$repo/scripts/profile_input.py" --data /tmp/imagenet_like --out "$out/input_profile.json" \
        > "$out/input_profile.log" 2>&1; stamp "input profile done rc=$?"
      tail -n 23 "$out/input.log"; tail -n 1 "$out/input_profile.log"
      ;;
    tests)
      (cd "$repo" && pytest -q -p no:cacheprovider tests/kernels tests/ops tests/layers tests/engine/test_engine_guards.py \
        tests/diffusion/test_gaussian.py ${LV_TESTS_K:+-k "$LV_TESTS_K"} \
        > "$out/tests.log" 2>&1); stamp "tests done rc=$?"; tail -n 15 "$out/tests.log"
      ;;
    resolution)
      start_mps
      fast="train.compile=true train.compile_mode=reduce-overhead data.pipeline=gpu data.cache=device"
      sizes="--img-size 16 24 32 48 64 96"
      classify() {  # GPUS TAG EPOCHS NAMES... -- BENCHMARK ARGS
        local gpus=$1 tag=$2 epochs=$3; shift 3
        CUDA_VISIBLE_DEVICES=$gpus python3 "$repo/scripts/run_variants.py" --family classify --data /tmp/cifar \
          --out "$out/$tag" --work "/tmp/lightvision_$tag" --tag "$tag" --workers 3 \
          --variants "$repo/configs/variants/classify_cifar10.yaml" "$@" --epochs "$epochs" --set $fast \
          > "$out/$tag.log" 2>&1; stamp "$tag done rc=$?"
      }
      kinds="softmax lightnet lion_d lion_s lion_s_snake"
      groups=" ${LV_GROUPS:-table screen dit} "
      [[ $groups == *" table "* ]] && classify "${LV_TABLE_GPUS:-0,1,2,3}" "${LV_TABLE_TAG:-resolution_table}" \
        "${LV_EPOCHS:-200}" ${LV_TABLE_NAMES:-$kinds lion_d_cls lion_s_cls lion_s_snake_cls} -- $sizes --eval-pos image token \
        image:p=1 image:p=1.5 image:p=2 image:p=1,2 image:p=2,1 image:embed=token image:blocks=token &
      [[ $groups == *" screen "* ]] && classify 3,2,1,0 resolution_screen "${LV_SCREEN_EPOCHS:-15}" $kinds softmax_sizes lightnet_sizes lion_d_sizes \
        lion_s_sizes lion_s_snake_sizes softmax_scale lightnet_scale lion_d_scale lion_s_scale lion_s_snake_scale \
        -- $sizes --eval-pos image token &
      [[ $groups == *" dit "* ]] && CUDA_VISIBLE_DEVICES=1,2,3,0 python3 "$repo/scripts/run_variants.py" $kinds --steps "${LV_DIT_STEPS:-2500}" \
        --data /tmp/cifar --out "$out/resolution_dit" --work /tmp/lightvision_resolution_dit --tag resolution_dit \
        -- --no-fid --samples 500 --bpd-images 500 --sample-steps 50 --sample-sizes 32 48 64 \
        --sample-units image token > "$out/resolution_dit.log" 2>&1 && stamp "resolution_dit done" &
      wait
      ;;
    dit_curves)
      [ "${LV_MPS:-1}" = 1 ] && start_mps
      size="${LV_SIZE:-b}"; tag="dit_curves_$size"; work="${LV_WORK:-/tmp/lightvision_$tag}"
      stop="${LV_STOP_AFTER:-400}"; [ "$stop" = 0 ] && stop=""
      mkdir -p "$out/$tag"  # reports and logs live in $work/report (kept across calls), copied to OUT
      PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 "$repo/scripts/run_variants.py" \
        ${LV_NAMES:-softmax lightnet lion_s} --steps "${LV_STEPS:-20000}" --resume ${stop:+--stop-after "$stop"} \
        ${LV_PROCS:+--procs $LV_PROCS} \
        --data /tmp/cifar --out "$work/report" --work "$work" --tag "$tag" \
        --variants "$repo/configs/variants/diffusion_cifar10.yaml" -- --size "$size" \
        --recipe "$repo/${LV_RECIPE:-configs/diffusion/cifar10_paper.yaml}" --eval-every "${LV_EVAL_EVERY:-2000}" \
        --samples "${LV_EVAL_SAMPLES:-2000}" --sample-steps "${LV_SAMPLE_STEPS:-50}" --sample-batch 500 \
        --bpd-images "${LV_BPD_IMAGES:-1000}" --bpd-buckets "${LV_BPD_BUCKETS:-4}" \
        --set train.ckpt_every_steps="${LV_CKPT_EVERY:-500}" train.keep_last=2 ${LV_SET:-} \
        > "$out/$tag/run_variants.log" 2>&1; stamp "dit curves rc=$? (paused runs continue with the same command)"
      cp "$work/report"/*.json "$work/report"/log_*.txt "$work/report"/parts/grid_*.png "$out/$tag/" 2> /dev/null
      python3 "$repo/scripts/plot_dit_curves.py" "$work/report/diffusion_cifar10_$tag.json" --work "$work" \
        --out "$out/$tag/$tag" ${LV_PREVIOUS:+--previous $(printf "$repo/%s " $LV_PREVIOUS)}
      tail -n 12 "$out/$tag/run_variants.log"
      ;;
    variants)
      start_mps
      python3 "$repo/scripts/run_variants.py" ${LV_NAMES:?} --steps "${LV_STEPS:-4000}" --deadline "${LV_DEADLINE:-540}" \
        --eval-seconds "${LV_EVAL_SECONDS:-150}" \
        --data /tmp/cifar --out "$out" --variants "$repo/configs/variants/diffusion_cifar10.yaml" \
        --tag "${LV_TAG:-variants}" -- ${LV_BENCH_ARGS:-} > "$out/variants.log" 2>&1; stamp "variants done rc=$?"
      tail -n 40 "$out/variants.log"
      ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
stamp "all done"
