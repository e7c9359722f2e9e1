# Source this on a GPU machine without internet to use the checkout without installing it:
#   source scripts/device_env.sh
# Installs wheels carried in .whl/ (timm, einops, diffusers, torch-fidelity) into /tmp/site and builds
# /tmp/lvsite, a symlink tree that maps kernels/, classify/, diffusion/ to lightvision.kernels/.classify/
# .diffusion exactly as the setuptools package-dir mapping does. Run tools as `pytest` / `python3 scripts/...`,
# not `python3 -m ...` from the checkout root: that puts the checkout's own lightvision/ first on sys.path.
_lv_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -d "$_lv_root/.whl" ] && [ ! -f /tmp/site/.lv_installed ]; then  # once per machine: stages may run side by side
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$_lv_root"/.whl/*.whl || return 1
  touch /tmp/site/.lv_installed
fi
# /tmp/lvsite is a symlink swapped in one rename: processes of a stage already running keep importing from it
_lv_tree="$(mktemp -d /tmp/lvsite.XXXXXX)" && mkdir -p "$_lv_tree/lightvision" || return 1
for _f in "$_lv_root"/lightvision/*; do ln -s "$_f" "$_lv_tree/lightvision/"; done
for _p in kernels classify diffusion; do ln -s "$_lv_root/$_p" "$_lv_tree/lightvision/$_p"; done
[ -L /tmp/lvsite ] || rm -rf /tmp/lvsite
ln -sfn "$_lv_tree" "$_lv_tree.link" && mv -T "$_lv_tree.link" /tmp/lvsite
export PYTHONPATH="/tmp/lvsite:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print('device env: torch', torch.__version__, 'triton', triton.__version__, 'gpu', torch.cuda.get_device_name(0))"
