"""The static gate's rule tables: which imports, names, attributes and calls a candidate
may use, whatever its backend (a backend adds its own: ``kernelflow.verification.backends``).
The walker that applies them is :mod:`.walker`; which attribute
chains of the allowed modules may be used is judged in :mod:`.chains`.

Most tables are allow-lists: what is not named here is refused.
"""

from __future__ import annotations


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Modules (and the module paths under them) every candidate may import; the roots of the
# backend's kernel languages (its own and those it borrows: triton) and its
# ``extra_imports`` come on top. What may be reached through them: chains.
ALLOWED_IMPORTS = ("torch", "math", "typing", "__future__", "collections.abc")
# Modules whose stream, event and graph attributes are stream tricks (torch.cuda is judged
# with the torch chains).
STREAM_MODULES = ("cupy.cuda.",)

# ------------------------------------------------------------------ torch

# torch.<name> that are glue anywhere but in kernels: allocation, dtype/device objects.
TORCH_GLUE = {
    "empty",
    "empty_like",
    "empty_strided",
    "zeros",
    "zeros_like",
    "ones",
    "ones_like",
    "full",
    "full_like",
    "arange",
    "tensor",
    "as_tensor",
    "Tensor",
    "Size",
    "device",
    "dtype",
    "no_grad",
    "inference_mode",
    "is_tensor",
    "is_floating_point",
    "finfo",
    "iinfo",
    "float32",
    "float",
    "float64",
    "double",
    "float16",
    "half",
    "bfloat16",
    "int8",
    "int16",
    "int32",
    "int64",
    "long",
    "int",
    "uint8",
    "bool",
    "contiguous_format",
    "preserve_format",
    "channels_last",
    "channels_last_3d",
    "Generator",
}
# The glue a callback Triton runs during a launch may use: dtypes, to compare with.
TORCH_DTYPES = _names("float32 float float64 double float16 half bfloat16 int8 int16 int32")
TORCH_DTYPES |= _names("int64 long int uint8 bool")
# torch.<name> that __init__ may also use: random initialisation, and tensor functions to
# prepare parameters (it sees no input, so nothing it computes can stand in for a kernel).
TORCH_INIT = _names(
    """rand randn randint rand_like randn_like randint_like randperm normal bernoulli
    linspace logspace eye diag cat concat stack chunk split flatten reshape transpose t
    permute squeeze unsqueeze flip roll tril triu where clamp abs sign sqrt rsqrt exp log
    sin cos tanh sigmoid matmul mm outer kron prod sum mean amax amin cumsum cumprod numel"""
)
# torch.<namespace>.<name> that is PyTorch compute (refused in forward as torch_compute).
TORCH_COMPUTE_NAMESPACES = _names("linalg fft special sparse nested masked functional Tensor")
# torch.cuda.<name> that are harmless.
TORCH_CUDA_GLUE = {
    "is_available",
    "current_device",
    "device_count",
    "get_device_properties",
    "synchronize",
}
# The methods of torch.nn.Module (torch 2.x): PyTorch calls them on a module itself (to,
# eval, _apply, __call__'s forward ...), so a candidate's method of one of these names may
# run in a call whoever else calls it (context). A test keeps it a superset of the
# installed torch's.
NN_MODULE_API = _names(
    """_apply _call_impl _get_backward_hooks _get_backward_pre_hooks _get_name
    _load_from_state_dict _maybe_warn_non_full_backward_hook _named_members
    _register_load_state_dict_pre_hook _register_state_dict_hook
    _replicate_for_data_parallel _save_to_state_dict _slow_forward _wrapped_call_impl
    add_module apply bfloat16 buffers children compile cpu cuda double eval extra_repr float
    forward get_buffer get_extra_state get_parameter get_submodule half ipu load_state_dict
    modules mtia named_buffers named_children named_modules named_parameters parameters
    register_backward_hook register_buffer register_forward_hook register_forward_pre_hook
    register_full_backward_hook register_full_backward_pre_hook
    register_load_state_dict_post_hook register_load_state_dict_pre_hook register_module
    register_parameter register_state_dict_post_hook register_state_dict_pre_hook
    requires_grad_ set_extra_state set_submodule share_memory state_dict to to_empty train
    type xpu zero_grad"""
)
# What PyTorch calls on a custom autograd function itself, besides forward (backward only
# where a graph was recorded: never under the verifier's no_grad).
AUTOGRAD_API = _names("setup_context jvp vmap")
# The one name of torch.autograd a candidate may use: the base of a custom autograd
# function (the rest of torch.autograd holds hooks and graph internals).
AUTOGRAD_FUNCTION = "torch.autograd.Function"
# torch.nn.<name> usable outside __init__ (parameter containers); every other nn class is
# built in __init__ only.
NN_ANYWHERE = {"Module", "Parameter", "ParameterList", "ParameterDict", "ModuleList"}
# Modules of torch.nn a candidate may import; of their names only nn.init's initialisers
# (in-place, named with a trailing "_") and these helpers, in __init__. (nn.functional and
# nn.init also hold modules: torch, importlib, math, numpy as np.)
NN_NAMESPACES = ("functional", "init", "grad")
# nn's helpers that turn an int into a tuple of it (kernel sizes, strides): pure, and the
# one thing of torch.nn.modules a candidate may name.
NN_TUPLE_HELPERS = frozenset(
    f"torch.nn.modules.utils.{name}" for name in ("_single", "_pair", "_triple", "_quadruple")
)
NN_INIT_HELPERS = _names("calculate_gain _calculate_fan_in_and_fan_out _calculate_correct_fan")
# typing's names a candidate may use: its classes (capitalised) and these; typing also holds
# modules (sys, types, operator, functools).
TYPING_LOWERCASE = _names("cast overload final")
# Calls that read, write or map files, however the path is built.
FILE_CALLS = (
    "torch.save",
    "torch.load",
    "torch.from_file",
    "torch.serialization.",
    "torch.hub.",
    "torch.onnx.",
    "torch.jit.",
    "torch.export.",
    "torch.profiler.",
    "torch.distributed.",
    "torch.utils.",
    "torch.package.",
)
FILE_ATTRS = {"tofile", "fromfile", "from_file", "save", "savez", "savetxt", "dump", "dumps"}

# ------------------------------------------------------------------ callbacks

# What a callback Triton runs during a launch (a grid function, a heuristic) may use:
# arithmetic on sizes, these builtins, and these attributes of tensors and of the meta dict.
LAUNCH_BUILTINS = _names("min max int float len abs round range tuple list bool divmod sum")
LAUNCH_BUILTINS |= _names("isinstance enumerate zip")
LAUNCH_ATTRS = _names(
    "shape dtype device ndim numel size stride dim element_size is_contiguous itemsize "
    "get keys values items"
)
# What makes a tensor of another class than torch.Tensor from a tensor, whose methods PyTorch
# then calls on every operation (KernelBench's "lazy_eval"): methods and attributes of
# torch.Tensor and torch._C (``__new__`` of a torch class is one too: checks).
TENSOR_SUBCLASS_MAKERS = _names("as_subclass _make_subclass _make_wrapper_subclass TensorBase")
TENSOR_SUBCLASS_MAKERS |= _names("_TensorBase _TensorMeta")
# Methods Triton or PyTorch call back on objects (a kernel argument's data_ptr, a module's
# call path): a candidate class must not define them (nor dunders but __init__).
CALLBACK_METHODS = _names(
    "data_ptr untyped_storage storage storage_offset new_empty set_ _call_impl "
    "_wrapped_call_impl _slow_forward _apply"
)

# ------------------------------------------------------------------ tensor compute

# Tensor methods that compute (standing in for the kernel when called outside __init__).
TENSOR_COMPUTE = _names(
    """abs acos add add_ addcmul addmm all amax amin any argmax argmin argsort asin atan
    baddbmm bmm ceil clamp clamp_ clip cos cosh cross cummax cumprod cumsum div div_ dot
    einsum eq erf exp exp_ expm1 floor fmod gather ge gelu gt hardtanh index_add
    index_select kthvalue le lerp log log10 log1p log2 log_softmax logsumexp lt masked_fill
    masked_fill_ matmul max maximum mean median min minimum mm mul mul_ mv nan_to_num ne neg
    norm outer pow prod reciprocal relu relu_ remainder round rsqrt scatter scatter_add
    sigmoid sign silu sin sinh softmax sort sqrt square std sub sub_ sum tan tanh topk tril
    triu var where tolist apply_ map_"""
)

# ------------------------------------------------------------------ introspection

# Names whose mere use means introspection or dynamic code.
BANNED_NAMES = _names(
    "eval exec compile globals locals vars dir __import__ __builtins__ setattr delattr open "
    "breakpoint input memoryview help"
)
# Builtins that look attributes up by name or build classes: only called, with a literal
# name (getattr/hasattr) or one argument (type).
DYNAMIC_BUILTINS = _names("getattr hasattr type")
# Builtin types whose unbound methods would act on any object (dict.setdefault(d, ...)).
BUILTIN_TYPES = _names("dict list set frozenset object type bytearray")
# Dunder attributes a candidate may use (super().__init__(), nn.Module.__init__(self)).
ALLOWED_DUNDERS = _names("__init__ __name__")
# Attributes (not dunders: every dunder but ALLOWED_DUNDERS is refused) that reach frames,
# tracing, the module table, hooks, PyTorch internals, or numpy (compute no guard sees).
BANNED_ATTRS = _names(
    """numpy f_back f_globals f_locals f_code f_builtins gi_frame cr_frame tb_frame tb_next
    ag_frame _getframe _current_frames modules settrace setprofile data_ptr_hook
    register_forward_hook register_forward_pre_hook _C _dynamo _inductor ops library func
    autograd"""
)

# ------------------------------------------------------------------ state

CACHE_DECORATORS = _names("lru_cache cache cached_property memoize memoized")
# Methods that change the object they are called on (containers, nn.Module state); the
# in-place tensor methods (``copy_``, ``fill_`` ...) are those whose name ends with "_".
MUTATING_METHODS = _names(
    """append extend insert setdefault update add pop popitem clear remove discard sort
    reverse appendleft extendleft register_buffer register_parameter add_module
    register_module load_state_dict set_extra_state"""
)
# Methods whose result is a new object (any other method's result may be a view of its
# receiver, or an object kept in it: ``x.view(-1)``, ``d.get(k)``). Not ``copy``: a list's
# or dict's is shallow (a new container of the same objects; scopes).
COPYING_METHODS = _names("clone new_empty new_zeros new_ones new_full new_tensor")

# ------------------------------------------------------------------ precision

# Dtype names below fp32 (as attributes, imported names and string literals).
LOW_PRECISION = _names(
    """float16 half bfloat16 fp16 bf16 HalfTensor BFloat16Tensor float8e4b15 float8e4b8
    float8e4nv float8e5 float8e5b16 fp8e4b15 fp8e4b8 fp8e4nv fp8e5 fp8e5b16 float8_e4m3fn
    float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz float8_e8m0fnu"""
)
LOW_PRECISION_STRINGS = LOW_PRECISION | {f"torch.{name}" for name in LOW_PRECISION}
LOW_PRECISION_STRINGS |= {"torch.cuda.HalfTensor", "torch.cuda.BFloat16Tensor"}
# Calls that make a dtype from a value: only with a literal (a kernel language adds its
# own: KernelLanguage.dtype_constructors).
DTYPE_CONSTRUCTORS = {"torch.dtype"}
# Precision arguments (tl.dot's, wherever given): anything but these values rounds fp32
# inputs (tf32).
FULL_PRECISION_DOT = {"input_precision": ("ieee",), "allow_tf32": (False,)}

STREAM_ATTRS = {
    "Stream",
    "get_current_stream",
    "stream",
    "Event",
    "set_stream",
    "CUDAGraph",
    "graph",
    "graphs",
    "ExternalStream",
    "current_stream",
    "default_stream",
}
