# Sourced by cpu_adam_probe.sh and cpu_adam_dtype_probe.sh (arguments DEEPSPEED_SRC OUT_DIR):
# sets src, out, here and a build folder whose torch/extension.h declares only what DeepSpeed's
# CPU Adam loops name (a Tensor for the bindings' signatures, the c10 dtypes of c10_shim.h), and
# writes the machine's lscpu to OUT_DIR/cpu_adam_machine.txt.
set -euo pipefail
src=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
mkdir -p "$build/torch"
cp "$here/c10_shim.h" "$here/probe_timing.h" "$build/"
printf '#include "c10_shim.h"\nnamespace torch { struct Tensor; }\n' > "$build/torch/extension.h"
lscpu > "$out/cpu_adam_machine.txt" 2>&1 || true
