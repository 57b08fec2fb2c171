"""Every pock pass, registered by its command-line name in this one place."""

from .pock_apply_sparse_config import ApplySparseConfigPass
from .pock_autodiff import AutodiffPass
from .pock_backend_switch import BackendSwitchPass
from .pock_dce import DeadCodeEliminationPass
from .pock_expand_custom import ExpandCustomPass
from .pock_factor_reductions import FactorReductionsPass
from .pock_lower_optimizers import LowerOptimizersPass
from .pock_order_param_reads import OrderParamReadsPass
from .pock_reorder_updates import ReorderUpdatesPass
from .pock_sparse_bp import SparseBackpropPass
from .pock_step_into import StepIntoPass
from .pock_strip_params import StripParamsPass

PASSES = {
    p.name: p
    for p in (
        ApplySparseConfigPass,
        AutodiffPass,
        BackendSwitchPass,
        DeadCodeEliminationPass,
        ExpandCustomPass,
        FactorReductionsPass,
        LowerOptimizersPass,
        OrderParamReadsPass,
        ReorderUpdatesPass,
        SparseBackpropPass,
        StepIntoPass,
        StripParamsPass,
    )
}
