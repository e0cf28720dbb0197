#!/usr/bin/env bash
# docs/api.md's "Reference: every public op and tensor method" names every function core/ops.h declares,
# every free function and public method of class Tensor in core/tensor.h (issue 31: a user read the headers
# to find matmul, transpose, item). A name counts when the section holds it followed by "(" (or "<", for
# the template data_as<T>).
#   tests/api_reference_test.sh SOURCE_DIR
set -uo pipefail
root=${1:?usage: api_reference_test.sh SOURCE_DIR}
doc=$root/docs/api.md
heading='## Reference: every public op and tensor method'
section=$(awk -v h="$heading" '$0 == h { on = 1; next } on && /^## / { exit } on' "$doc")
if [ -z "$section" ]; then
  echo "FAIL: $doc has no section '$heading'"
  exit 1
fi
# Declared but not for models: how ops reach the backends (core's own dispatch).
internal=" run_kernel run_kernel_general "
names() {
  # Free functions of ops.h and tensor.h (not operators), then class Tensor's public methods.
  sed -nE 's/^(inline )?[A-Za-z_:<>]+ &?([a-z_0-9]+)\(.*/\2/p' "$root/core/ops.h" "$root/core/tensor.h"
  awk '/^class Tensor \{/ { on = 1; next } on && /^ private:/ { exit } on' "$root/core/tensor.h" |
    sed -nE 's/^  [^/ (][^(]*[ &*]([a-z_0-9]+)\(.*/\1/p'
}
failures=0 checked=0
for name in $(names | sort -u); do
  case "$internal" in *" $name "*) continue ;; esac
  checked=$((checked + 1))
  if ! grep -qE "(^|[^A-Za-z0-9_])$name(\(|<)" <<<"$section"; then
    echo "FAIL: '$name' is declared in core/ops.h or core/tensor.h but not listed in $doc ('$heading')"
    failures=$((failures + 1))
  fi
done
if [ "$checked" -lt 80 ]; then
  echo "FAIL: only $checked names were found in the headers; the extraction no longer matches their form"
  exit 1
fi
[ "$failures" -eq 0 ] && echo "api_reference: all $checked public names are listed" || exit 1
