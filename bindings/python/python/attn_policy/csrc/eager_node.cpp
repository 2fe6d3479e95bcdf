// The eager autograd node of attn_policy.torch.attention, in C++.
//
// Why C++: torch runs a backward written in Python on autograd's device thread, under the
// GIL, which alone costs more than SDPA's whole eager forward + backward. This node is an
// ordinary torch::autograd::Function; its forward and backward call the executors' plans
// through a table of C functions exported by attn_policy._native (src/eager_abi.rs), so no
// Python runs in the backward.
//
// Built on first use against the torch in the process by attn_policy/eager_node.py (C++17 or
// C++20, whichever that torch's headers require; torch's headers and libraries; no CUDA toolkit: the current CUDA stream comes from
// c10's device-guard interface). Loaded with torch.ops.load_library; the ops live in the
// namespace attn_policy_eager:
//   set_abi(int address, int version) -> ()   the table from _native.plan_abi()
//   attention(Tensor q, Tensor k, Tensor v, int plan) -> Tensor
//       O of the plan's problem (the plan is a NativePlan.handle; the caller checked that the
//       tensors match it, and the plan checks every pointer against its storage's bytes),
//       differentiable in q, k, v.
//   forward(Tensor q, Tensor k, Tensor v, int plan) -> Tensor
//       The same O for a call that needs no gradient (no autograd node).

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cstdint>

// Named (not anonymous) so that grad_fn.name() reads
// "torch::autograd::CppNode<attn_policy_eager::Attention>".
namespace attn_policy_eager {

struct Plan;  // Opaque: a Rust PlanCore.

struct PlanInfo {
  int64_t batch;
  int64_t heads_q;
  int64_t seqlen_q;
  int32_t lse_f64;
  int32_t on_host;
  uint64_t workspace_forward;
};

// Field order and types must match PlanAbi in src/eager_abi.rs (checked by version).
struct PlanAbi {
  uint32_t version;
  void (*retain)(const Plan*);
  void (*release)(const Plan*);
  void (*info)(const Plan*, PlanInfo*);
  int32_t (*workspace_backward)(const Plan*, uint64_t*);
  // (plan, pointers, bytes each pointer's storage holds from it, workspace, bytes, stream)
  int32_t (*forward)(const Plan*, const uint64_t*, const uint64_t*, uint64_t, uint64_t, uint64_t);
  int32_t (*backward)(const Plan*, const uint64_t*, const uint64_t*, uint64_t, uint64_t,
                      uint64_t);
  const char* (*last_error)();
};

constexpr int64_t kAbiVersion = 2;
const PlanAbi* abi = nullptr;

void set_abi(int64_t address, int64_t version) {
  TORCH_CHECK(version == kAbiVersion, "attn_policy_eager: plan ABI version ", version,
              " from attn_policy._native, this node speaks ", kAbiVersion,
              " (rebuild it: python -m attn_policy.eager_node --build)");
  abi = reinterpret_cast<const PlanAbi*>(static_cast<uintptr_t>(address));
}

// A reference to a plan held by an autograd graph: the plan outlives the Python cache entry
// that made it while a backward may still need it.
struct PlanRef : torch::CustomClassHolder {
  const Plan* plan;
  explicit PlanRef(const Plan* p) : plan(p) { abi->retain(p); }
  ~PlanRef() override { abi->release(plan); }
};

// The Python exception each status maps to (attn_policy/torch.py re-raises it typed).
void check(int32_t status) {
  if (status == 0) return;
  const char* kind = status == 1   ? "ExecutorRefused"
                     : status == 2 ? "ExecutorUnavailable"
                     : status == 3 ? "InvalidInput"
                                   : "ExecutorFailed";
  TORCH_CHECK(false, "attn_policy[", kind, "]: ", abi->last_error());
}

uint64_t ptr(const at::Tensor& t) {
  if (!t.has_storage()) return 0;
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(t.data_ptr()));
}

// The bytes t's storage holds from its data pointer: the plan refuses a problem that reaches
// past them (a storage resized after the view was made, say), so no kernel reads outside it.
uint64_t avail(const at::Tensor& t) {
  if (!t.has_storage()) return 0;
  const int64_t used = t.storage_offset() * static_cast<int64_t>(t.itemsize());
  const int64_t total = static_cast<int64_t>(t.storage().nbytes());
  return total > used ? static_cast<uint64_t>(total - used) : 0;
}

// torch's current stream on the tensor's device (0 on the host).
uint64_t current_stream(const at::Tensor& t) {
  if (!t.is_cuda()) return 0;
  const auto* guard = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return static_cast<uint64_t>(
      reinterpret_cast<uintptr_t>(guard->getStream(t.device()).native_handle()));
}

at::Tensor workspace(uint64_t bytes, const at::Tensor& like) {
  return at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
}

// O and the LSE of the plan's forward, allocated here and enqueued on the current stream.
std::pair<at::Tensor, at::Tensor> run_forward(const Plan* plan, const at::Tensor& q,
                                              const at::Tensor& k, const at::Tensor& v) {
  PlanInfo info{};
  abi->info(plan, &info);
  auto o_sizes = q.sizes().vec();
  o_sizes.back() = v.size(-1);
  at::Tensor o = at::empty(o_sizes, q.options());
  at::Tensor lse = at::empty({info.batch, info.heads_q, info.seqlen_q},
                             q.options().dtype(info.lse_f64 ? at::kDouble : at::kFloat));
  const uint64_t n = info.on_host ? 0 : info.workspace_forward;
  at::Tensor ws = n ? workspace(n, q) : at::Tensor();
  const uint64_t ptrs[5] = {ptr(q), ptr(k), ptr(v), ptr(o), ptr(lse)};
  const uint64_t bytes[5] = {avail(q), avail(k), avail(v), avail(o), avail(lse)};
  check(abi->forward(plan, ptrs, bytes, n ? ptr(ws) : 0, n, current_stream(q)));
  return {o, lse};
}

const Plan* plan_at(int64_t address) {
  TORCH_CHECK(abi != nullptr, "attn_policy_eager: set_abi was not called");
  return reinterpret_cast<const Plan*>(static_cast<uintptr_t>(address));
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Attention : public torch::autograd::Function<Attention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, int64_t plan_address) {
    const Plan* plan = plan_at(plan_address);
    auto [o, lse] = run_forward(plan, q, k, v);
    ctx->save_for_backward({q, k, v, o, lse});
    ctx->saved_data["plan"] = c10::make_intrusive<PlanRef>(plan);
    return o;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // The executors' backward is not itself differentiable: a double backward would treat
    // the gradients as constants, a silent wrong answer.
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "attn_policy.torch.attention supports one backward: double backward "
                "(create_graph=True) is not supported");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &o = saved[3],
                     &lse = saved[4];
    const Plan* plan = ctx->saved_data["plan"].toCustomClass<PlanRef>()->plan;
    at::Tensor g = grads[0];
    if (!g.defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    if (g.strides() != o.strides()) {
      // dO must have the strides of O.
      g = o.is_contiguous() ? g.contiguous() : at::empty_like(o).copy_(g);
    }
    at::Tensor dq = at::empty_strided(q.sizes(), q.strides(), q.options());
    at::Tensor dk = at::empty_strided(k.sizes(), k.strides(), k.options());
    at::Tensor dv = at::empty_strided(v.sizes(), v.strides(), v.options());
    uint64_t n = 0;
    check(abi->workspace_backward(plan, &n));
    at::Tensor ws = n ? workspace(n, q) : at::Tensor();
    const uint64_t ptrs[9] = {ptr(q),   ptr(k),  ptr(v),  ptr(o), ptr(g),
                              ptr(lse), ptr(dq), ptr(dk), ptr(dv)};
    const uint64_t bytes[9] = {avail(q),   avail(k),  avail(v),  avail(o), avail(g),
                               avail(lse), avail(dq), avail(dk), avail(dv)};
    check(abi->backward(plan, ptrs, bytes, n ? ptr(ws) : 0, n, current_stream(q)));
    return {dq, dk, dv, at::Tensor()};
  }
};

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     int64_t plan) {
  plan_at(plan);
  return Attention::apply(q, k, v, plan);
}

// A call that needs no gradient: O alone, no autograd node.
at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t plan) {
  return run_forward(plan_at(plan), q, k, v).first;
}

}  // namespace attn_policy_eager

TORCH_LIBRARY(attn_policy_eager, m) {
  m.class_<attn_policy_eager::PlanRef>("PlanRef");
  m.def("set_abi(int address, int version) -> ()", &attn_policy_eager::set_abi);
  m.def("attention(Tensor q, Tensor k, Tensor v, int plan) -> Tensor", &attn_policy_eager::attention);
  m.def("forward(Tensor q, Tensor k, Tensor v, int plan) -> Tensor", &attn_policy_eager::forward);
}
