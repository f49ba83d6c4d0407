#!/bin/bash
# libgtp.so must export the C ABI (gtp_*) and no other defined dynamic symbol.
set -euo pipefail
lib="$1"
symbols=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v '^$')
for name in gtp_context_create gtp_drain_ex gtp_grad_buffer_ex; do
  echo "$symbols" | grep -qx "$name" || { echo "$name is not exported"; exit 1; }
done
others=$(echo "$symbols" | grep -v '^gtp_' || true)
if [ -n "$others" ]; then
  echo "libgtp.so exports symbols outside gtp_*:"; echo "$others"; exit 1
fi
echo "exported: $(echo "$symbols" | wc -l) gtp_* symbols"
