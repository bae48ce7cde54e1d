"""Triton's rule tables for the static gate: which names of ``triton`` and
``triton.language`` a candidate may use, where (docs/verifier.md, "The static gate").
Applied by :mod:`.triton_gate`; the tables every backend shares are
:mod:`kernelflow.verification.gate.rules`. Allow-lists: what is not named here is refused.

Daemon side only.
"""

from __future__ import annotations


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# triton.<name> a candidate may use; the decorators only on module-level kernels.
TRITON_TOP = _names("jit autotune heuristics Config cdiv next_power_of_2 language")
TRITON_DECORATORS = _names("jit autotune heuristics")
# triton.<name> that are integer arithmetic on their arguments (constexpr functions since
# Triton 3.4; earlier code generators call them on constexprs as plain Python): a callback run
# during a launch (a grid function) and a @triton.jit body may call them.
TRITON_ARITHMETIC = _names("cdiv next_power_of_2")
# triton.language.<name>: the language (functions, dtypes, types) of every Triton release a
# candidate may be written for (2.1 on: ``advance``, block pointers' step, left the top level
# in 3.5). Not its modules (core, standard, semantic ... reach Python's builtins), nor
# str_to_ty (a dtype from a string).
TL_NAMES = _names(
    """PropagateNan TRITON_MAX_TENSOR_NUMEL abs add advance arange argmax argmin associative_scan
    assume atomic_add atomic_and atomic_cas atomic_load atomic_max atomic_min atomic_or
    atomic_poll atomic_store atomic_xchg atomic_xor bfloat16 bitonic_merge block_type
    broadcast broadcast_to cast cat cdiv ceil clamp condition const constexpr constexpr_type
    cos cumprod cumsum debug_barrier device_assert device_print div_rn dot dot_scaled dtype
    erf exp exp2 expand_dims expect_zero fdiv flip float16 float32 float64 float8e4b15
    float8e4b8 float8e4nv float8e5 float8e5b16 floor fma full gather histogram
    inline_asm_elementwise int1 int16 int32 int64 int8 interleave join load
    load_tensor_descriptor log log2 make_block_ptr make_tensor_descriptor map_elementwise max
    max_constancy max_contiguous maximum min minimum mul multiple_of num_programs
    pair_uniform_to_normal permute philox philox_impl pi32_t pointer_type program_id rand
    rand4x randint randint4x randn randn4x range ravel reduce reduce_or reshape rsqrt sigmoid
    sin slice softmax sort split sqrt sqrt_rn squeeze static_assert static_print static_range
    store store_tensor_descriptor sub sum swizzle2d tensor tensor_descriptor
    tensor_descriptor_type to_tensor topk trans tuple tuple_type uint16 uint32 uint64 uint8
    uint_to_uniform_float umulhi unsqueeze view void where xor_sum zeros zeros_like"""
)
TL_MATH = _names("abs ceil cos div_rn erf exp exp2 fdiv floor fma log log2 rsqrt sin sqrt")
TL_MATH |= _names("sqrt_rn umulhi")
# Module paths under triton.language a candidate may name, and where libdevice lives.
TL_NAMESPACES = {
    ("math",),
    ("extra",),
    ("extra", "cuda"),
    ("extra", "libdevice"),
    ("extra", "cuda", "libdevice"),
}
TL_LIBDEVICE = {("extra", "libdevice"), ("extra", "cuda", "libdevice")}
# Methods and attributes of the language's values (tensors, pointers, dtypes); dtype
# predicates (is_fp32 ...) too.
TL_VALUE_API = _names(
    """T abs advance argmax argmin associative_scan atomic_add atomic_and atomic_cas
    atomic_load atomic_max atomic_min atomic_or atomic_poll atomic_store atomic_xchg
    atomic_xor broadcast_to cast cdiv ceil cos cumprod cumsum erf exp exp2 expand_dims flip
    floor gather histogram item log log2 logical_and logical_or max min permute ravel reduce
    reduce_or reshape rsqrt sigmoid sin softmax sort split sqrt sqrt_rn store sum to trans
    view xor_sum dtype shape type element_ty numel value primitive_bitwidth scalar"""
)
# What a kernel may read of its arguments directly (pointers, scalars), and of what that
# gives (dtypes: predicates is_* too): arguments come from the host, and an object handed in
# where a tensor belongs is Python the interpreter would run.
KERNEL_ARGUMENT_ATTRS = _names("dtype type to shape")
KERNEL_DTYPE_ATTRS = _names("element_ty scalar primitive_bitwidth")
# Python builtins the Triton language has (its code generator's builtin namespace).
JIT_BUILTINS = _names("range min max len float int isinstance")
# tl functions that take a function (its position and keyword): it must be a @triton.jit
# function of the module, not a Python callable handed in from outside.
TL_FUNCTION_ARGS = {
    "reduce": (2, "combine_fn"),
    "associative_scan": (2, "combine_fn"),
    "map_elementwise": (0, "scalar_fn"),
}
# Keyword arguments of triton's decorators and Config that are Python run around a launch.
CALLBACK_KEYWORDS = _names(
    "pre_hook post_hook prune_configs_by perf_model early_config_prune do_bench "
    "launch_metadata repr"
)
