// The `ffnlab._ffnlab` extension: ffnlab's FFN layers on numpy arrays (docs/python.md).
//   FFN(config=None, seed=0, **keys)  config: ffnlab's JSON config as a dict (docs/config.md)
//   from_hf(config_path, weights_path=None, prefix="", seed=0)
//   params(config) -> the cost accounting as a dict
//   set_threads(n), get_threads()
//   set_weight_packing_min_rows(rows), get_weight_packing_min_rows()
//   set_conv_min_rows(rows), get_conv_min_rows()
//   set_huge_page_min_bytes(bytes), get_huge_page_min_bytes()
// ffnlab::Error arrives as ValueError, ffnlab::SystemError as OSError (of its errno, where
// one says why), with the same one-line message. The GIL is released around the C++ work.
#include <fmt/format.h>
#include <omp.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <limits>
#include <mutex>
#include <new>
#include <nlohmann/json.hpp>
#include <string_view>
#include <system_error>

#include "arrays.hpp"
#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/config_flags.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/failure.hpp"
#include "ffnlab/io/ffn_io.hpp"
#include "ffnlab/layers/feed_forward.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"
#include "ffnlab/limits.hpp"
#include "ffnlab/names.hpp"
#include "ffnlab/ops/activation.hpp"
#include "ffnlab/ops/linear.hpp"
#include "ffnlab/study/zoo_table.hpp"
#include "python.hpp"

namespace ffnlab::python {

namespace {
std::atomic<int> chosen_threads{0};  // set_threads(n); 0: none chosen
}  // namespace

ChosenThreads::ChosenThreads() {
  const int n = chosen_threads.load();
  const int now = omp_get_max_threads();
  if (n > 0 && now != n) {
    before_ = now;
    omp_set_num_threads(n);
  }
}

ChosenThreads::~ChosenThreads() {
  if (before_ > 0) omp_set_num_threads(before_);
}

void ChosenThreads::choose(int n) {
  chosen_threads.store(n);
  omp_set_num_threads(n);  // this thread's own count too, as PyTorch's set_num_threads does
}

std::string shown(const py::handle& value) {
  std::string text;
  try {
    text = py::repr(value);
  } catch (const py::error_already_set&) {  // a __repr__ that fails
    text = std::string("<") + Py_TYPE(value.ptr())->tp_name + ">";
  }
  std::string out;
  for (const char c : text) out += c == '\n' ? "\\n" : c == '\r' ? "\\r" : std::string(1, c);
  if (out.size() <= 60) return out;
  std::size_t cut = 57;  // not inside a character's UTF-8 bytes (the message must stay UTF-8)
  while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;
  return out.substr(0, cut) + "...";
}

bool numpy_scalar(const py::handle& value, const char* kind) {
  const py::object numpy = py::module_::import("sys").attr("modules").attr("get")("numpy");
  return !numpy.is_none() && py::isinstance(value, numpy.attr(kind));
}

namespace {

// Python's OSError(errno, message), as its own file calls raise it: the errno's subclass
// (PermissionError, ...) with .errno, .strerror the message, str(e) "[Errno N] message"; it
// pickles whole. A failure no errno describes (0) is a plain OSError(message). A message that
// is not UTF-8 (a file name) keeps its other characters (U+FFFD for the rest).
void raise_os_error(int error_number, const std::string& message) {
  PyObject* text =
      PyUnicode_DecodeUTF8(message.data(), static_cast<Py_ssize_t>(message.size()), "replace");
  if (text == nullptr) return;  // (its error is set: memory)
  PyObject* args =
      error_number == 0 ? Py_BuildValue("(O)", text) : Py_BuildValue("(iO)", error_number, text);
  Py_DECREF(text);
  if (args == nullptr) return;
  PyObject* e = PyObject_Call(PyExc_OSError, args, nullptr);  // the subclass, made now
  Py_DECREF(args);
  if (e == nullptr) return;
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(e)), e);
  Py_DECREF(e);
}

// The key path of a value for a message: "key 'moe.top_k'", or "the config" for the whole.
std::string key_named(const std::string& key) {
  return key.empty() ? "the config" : "key '" + key + "'";
}

nlohmann::json json_of(const py::handle& v, const std::string& key, int depth) {
  PyObject* o = v.ptr();
  const auto bad = [&](std::string_view problem) {
    return py::value_error(fmt::format("[config] {} {}", key_named(key), problem));
  };
  if (depth > 64) throw bad("is nested more than 64 deep (or holds itself)");
  if (o == Py_None) return nullptr;
  if (PyBool_Check(o) || numpy_scalar(v, "bool_")) {
    const int truth = PyObject_IsTrue(o);
    if (truth < 0) throw py::error_already_set();
    return truth == 1;
  }
  if (PyLong_Check(o) || numpy_scalar(v, "integer")) {
    const py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(o));
    if (!i) throw py::error_already_set();
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
    if (x == -1 && PyErr_Occurred()) throw py::error_already_set();
    if (overflow == 0) return static_cast<std::int64_t>(x);
    if (overflow > 0) {
      const unsigned long long u = PyLong_AsUnsignedLongLong(i.ptr());
      if (!PyErr_Occurred()) return static_cast<std::uint64_t>(u);
      PyErr_Clear();
    }
    // JSON numbers here are 64-bit integers or doubles; the config's own range is checked next.
    throw bad(fmt::format("= {} is out of range (beyond 64 bits)", shown(i)));
  }
  if (PyFloat_Check(o) || numpy_scalar(v, "floating")) {
    const double x = PyFloat_AsDouble(o);
    if (x == -1.0 && PyErr_Occurred()) throw py::error_already_set();
    if (!std::isfinite(x)) throw bad(fmt::format("must be a finite number, got {}", shown(v)));
    return x;
  }
  if (PyUnicode_Check(o)) {
    Py_ssize_t size = 0;
    const char* text = PyUnicode_AsUTF8AndSize(o, &size);
    if (text == nullptr) {  // a lone surrogate
      PyErr_Clear();
      throw bad(fmt::format("must be text that UTF-8 can hold, got {}", shown(v)));
    }
    return std::string(text, static_cast<std::size_t>(size));
  }
  if (PyDict_Check(o)) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [k, value] : py::reinterpret_borrow<py::dict>(v)) {
      if (!PyUnicode_Check(k.ptr()))
        throw bad(fmt::format("has a key {} that is not a string", shown(k)));
      const std::string name = json_of(k, key, depth + 1).get<std::string>();
      j[name] = json_of(value, key.empty() ? name : key + "." + name, depth + 1);
    }
    return j;
  }
  if (PyList_Check(o) || PyTuple_Check(o)) {
    nlohmann::json j = nlohmann::json::array();
    std::size_t i = 0;
    for (const auto& item : py::reinterpret_borrow<py::sequence>(v))
      j.push_back(json_of(item, fmt::format("{}[{}]", key, i++), depth + 1));
    return j;
  }
  throw bad(fmt::format("must be a number, a string, a bool, a list or a dict, got {} (a {})",
                        shown(v), Py_TYPE(o)->tp_name));
}

}  // namespace

namespace {
// A dict that names a variant or a kind describes another layer: it replaces the config's dict.
// A dict that changes the routing drops the keys the new routing sets (routing_defaults), and
// those the old routing set that still hold its value, so that both take the new routing's
// values (BASE layers' top_k 1 and sigmoid do not follow a config to top-k routing); a value
// the config changed from the old routing's stays.
void merge_into(nlohmann::json& into, const nlohmann::json& from) {
  for (const auto& [key, value] : from.items()) {
    if (!value.is_object() || !into.contains(key) || !into[key].is_object() ||
        value.contains("variant") || value.contains("kind")) {
      into[key] = value;
      continue;
    }
    nlohmann::json& old = into[key];
    if (value.contains("routing") && value["routing"].is_string() &&
        old.value("routing", nlohmann::json()) != value["routing"]) {
      nlohmann::json sets = nlohmann::json::object(), had = nlohmann::json::object();
      try {
        sets = routing_defaults(value["routing"].get<std::string>());
      } catch (const Error&) {  // an unknown routing: the config's reader names it
      }
      try {
        const nlohmann::json was = old.value("routing", nlohmann::json("topk"));
        if (was.is_string()) had = routing_defaults(was.get<std::string>());
      } catch (const Error&) {
      }
      for (const auto& [set, unused] : sets.items()) old.erase(set);
      for (const auto& [set, default_value] : had.items())
        if (old.contains(set) && old[set] == default_value) old.erase(set);
    }
    merge_into(old, value);
  }
}
}  // namespace

nlohmann::json config_with_keys(const py::object& config, const py::kwargs& keys) {
  if (!config.is_none() && !py::isinstance<py::dict>(config))
    throw py::value_error("[python] config must be a dict (docs/config.md)");
  nlohmann::json j = config.is_none() ? nlohmann::json::object() : to_json(config);
  nlohmann::json given = nlohmann::json::object();
  for (const auto& [key, value] : keys) {
    const std::string name = py::str(key);
    given[name] = to_json(value, name);
  }
  merge_into(j, given);
  return j;
}

nlohmann::json to_json(const py::handle& obj, const std::string& key) {
  return json_of(obj, key, 0);
}

namespace {

// JSON to Python values, directly (a NaN stays float('nan'), where a round trip through JSON
// text would make it None).
template <class Json>
py::object python_of(const Json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return py::none();
    case nlohmann::json::value_t::boolean:
      return py::bool_(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return py::int_(j.template get<std::int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      return py::int_(j.template get<std::uint64_t>());
    case nlohmann::json::value_t::number_float:
      return py::float_(j.template get<double>());
    case nlohmann::json::value_t::string: {  // invalid UTF-8 (raw sample bytes) becomes U+FFFD
      const auto& text = j.template get_ref<const std::string&>();
      PyObject* o =
          PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "replace");
      if (o == nullptr) throw py::error_already_set();
      return py::reinterpret_steal<py::str>(o);
    }
    case nlohmann::json::value_t::array: {
      py::list out;
      for (const auto& item : j) out.append(python_of(item));
      return out;
    }
    case nlohmann::json::value_t::object: {
      py::dict out;
      for (const auto& [key, value] : j.items()) out[py::str(key)] = python_of(value);
      return out;
    }
    default:  // binary, discarded: nothing ffnlab writes
      throw Error("[python] a JSON value of a kind ffnlab does not write");
  }
}

}  // namespace

py::object from_json(const nlohmann::json& j) {
  return python_of(j);
}

py::object from_json(const nlohmann::ordered_json& j) {
  return python_of(j);
}

namespace {

FFNConfig config_of(const py::object& config, const py::kwargs& keys) {
  return config_from_json(config_with_keys(config, keys));
}

// The layers write an output of the right shape in place (Tensor::ensure); a layer that did not
// would leave the returned array unwritten, so that is checked, not assumed.
void written_in_place(const Tensor& t, const py::array_t<float>& a, const char* what) {
  if (t.numel() > 0 && t.raw() != a.data())
    throw std::logic_error(std::string("[python] the layer's ") + what +
                           " did not write into the array it was given");
}

// An array argument: a numpy array (the checks of its dtype, shape and layout follow), not a
// list or None, which numpy would convert into a new array the caller never sees.
py::array array_argument(std::string_view function, std::string_view name, const py::object& v) {
  if (!py::isinstance<py::array>(v)) bad_argument(function, name, "a float32 numpy array", v);
  return v.cast<py::array>();
}

// A layer's weights and gradients must fit: refused with a message before the allocation, as
// the command line does (a zero-filled buffer the system cannot back ends the interpreter).
void check_layer_memory(const FFNConfig& c) {
  const std::int64_t params = count_params(c);
  check_memory(8.0 * static_cast<double>(params), "python",
               fmt::format("a layer of {} parameters (weights and gradients)", params));
}

// An MoE whose router is a Linear: it has logits, and takes their gradient in backward.
bool has_router_logits(const FFNConfig& c) {
  return c.kind == FFNKind::moe && routing_family(c.moe.routing).router_linear;
}

// One FFN layer and what its Python caller handed it: the input of the last training forward
// (the layer reads it again in backward) is kept alive here.
class Layer {
 public:
  Layer(std::unique_ptr<FeedForward> ffn, std::uint64_t seed) : ffn_(std::move(ffn)), seed_(seed) {}

  py::array_t<float> forward(const py::object& x_arg, const py::object& train_arg,
                             const py::object& sequence_arg, const py::object& gate_residual,
                             const py::object& token_ids, const py::object& first_arg,
                             const py::object& stochastic_arg) {
    const FFNConfig& c = ffn_->config();
    const std::int64_t D = c.d_model;
    const py::array x = array_argument("forward", "x", x_arg);
    Tensor xt = borrow_rows(x, D, "x");
    const bool train = bool_argument("forward", "train", train_arg);
    const bool first = bool_argument("forward", "first", first_arg);
    // Training-only routing (jitter, gate noise, BASE's assignment): a training forward's, unless
    // the caller evaluates with gradients (stochastic=False).
    const bool stochastic =
        stochastic_arg.is_none() ? train : bool_argument("forward", "stochastic", stochastic_arg);
    if (stochastic && !train)
      throw py::value_error(
          "[python] stochastic=True routes as in training, which only a training forward does: "
          "give train=True too");
    const std::int64_t sequence = int_argument("forward", "sequence", sequence_arg, 0,
                                               std::numeric_limits<std::int64_t>::max(), false);
    // MoE++'s gating residual: the previous MoE layer's logits [T, E].
    Tensor rt;
    py::object residual_array = py::none();
    if (!gate_residual.is_none()) {
      if (c.kind != FFNKind::moe || !c.moe.gating_residual)
        throw py::value_error(
            "[python] gate_residual given, but the layer has no gating_residual (MoE++) to take "
            "it");
      // A named array: cast() may convert (a list, an __array__ object) into a new array, which
      // must live as long as the layer reads it (saved_residual_ below).
      residual_array = gate_residual.cast<py::array>();
      rt = borrow_rows(residual_array, c.moe.routed_experts(), "gate_residual");
      if (rt.dim(0) != xt.dim(0))
        throw py::value_error("[python] gate_residual has " + std::to_string(rt.dim(0)) +
                              " rows, x " + std::to_string(xt.dim(0)));
    }
    // The tokens' ids [T] (hash routing chooses by them), copied: the layer reads them in this
    // forward only.
    std::vector<std::int32_t> ids;
    if (!token_ids.is_none() && !reads_token_ids(c))
      throw py::value_error(
          "[python] token_ids given, but the layer's routing does not read them (hash routing "
          "does)");
    if (token_ids.is_none() && reads_token_ids(c) && xt.dim(0) > 0)
      throw py::value_error(
          fmt::format("[python] the layer's routing ({}) chooses experts by the tokens' ids: give "
                      "token_ids, one per row of x",
                      enum_name(c.moe.routing)));
    // first=True says that the layer takes no gate_residual: it means something only to MoE++'s
    // gating residual, and never beside one.
    if (first && (c.kind != FFNKind::moe || !c.moe.gating_residual))
      throw py::value_error(
          "[python] first=True: the layer has no gating_residual (MoE++), which alone reads it");
    if (first && !gate_residual.is_none())
      throw py::value_error(
          "[python] first=True: a model's first MoE layer takes no gate_residual; give one of "
          "them");
    if (!token_ids.is_none()) {
      // Integers only: numpy would cast floats (1.9 to 1) and route by ids never given.
      const py::array given = py::array::ensure(token_ids);
      if (!given || (given.dtype().kind() != 'i' && given.dtype().kind() != 'u'))
        bad_argument("forward", "token_ids", "integers (a list or an integer array)", token_ids);
      const auto a =
          token_ids.cast<py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>>();
      if (a.ndim() != 1 || a.shape(0) != xt.dim(0))
        throw py::value_error("[python] token_ids must be [T] = [" + std::to_string(xt.dim(0)) +
                              "], one id per row of x");
      for (py::ssize_t i = 0; i < a.shape(0); ++i) {
        const std::int64_t id = a.at(i);
        if (id < 0 || id > std::numeric_limits<std::int32_t>::max())
          throw py::value_error("[python] token id " + std::to_string(id) +
                                " is outside [0, 2^31)");
        ids.push_back(static_cast<std::int32_t>(id));
      }
    }
    auto [y, yt] = new_rows(xt.dim(0), D);
    std::uint64_t mine = 0;  // this forward's number
    {
      py::gil_scoped_release release;
      const ChosenThreads threads;
      std::lock_guard lock(mutex_);
      mine = ++forwards_;
      ffn_->context().sequence = sequence;
      ffn_->context().token_ids = ids.empty() ? nullptr : ids.data();
      ffn_->context().first_layer = first;
      ffn_->context().stochastic = stochastic;
      // Each stochastic forward draws new noise: the n-th from (seed, n), as a trainer's step n
      // does, so that a layer built with the same seed draws the same sequence.
      if (train && stochastic) ffn_->set_random_stream(seed_, stochastic_forwards_++);
      residual_ = rt;
      ffn_->context().previous_logits = residual_.defined() ? &residual_ : nullptr;
      struct Unset {  // `ids` ends with this call, a forward that throws included
        FFNContext& context;
        ~Unset() { context.token_ids = nullptr; }
      } unset{ffn_->context()};
      ffn_->forward(yt, xt, train);
    }
    written_in_place(yt, y, "forward");
    // The layer reads x's and the residual's memory again in backward: their arrays stay alive
    // here, unless another thread's forward ran after this one (the layer holds its
    // activations, and that forward keeps its own arrays).
    // (The arrays they replace are let go after the lock: their release may run Python code.)
    py::object old_x = train ? py::object(x) : py::none();
    py::object old_residual = train ? residual_array : py::none();
    {
      const auto lock = lock_with_gil();
      if (forwards_ == mine) {
        std::swap(saved_x_, old_x);
        std::swap(saved_residual_, old_residual);
      }
    }
    return y;
  }

  py::array_t<float> backward(const py::object& dy_arg, const py::object& dlogits) {
    const FFNConfig& c = ffn_->config();
    const std::int64_t D = c.d_model;
    const py::array dy = array_argument("backward", "dy", dy_arg);
    Tensor dyt = borrow_rows(dy, D, "dy");
    Tensor gt;
    py::array dlogits_array;  // alive until the backward below has read it
    if (!dlogits.is_none()) {
      // The logits' gradient from whatever read them (a next layer's gating residual, a loss on
      // them such as Hugging Face's balancing loss) joins the router's; a layer without router
      // logits (dense, hash routing, Soft MoE) has nothing it could join.
      if (!has_router_logits(c))
        throw py::value_error(
            "[python] dlogits given, but the layer has no router logits to take it (an MoE "
            "whose router is a Linear has)");
      dlogits_array = dlogits.cast<py::array>();
      gt = borrow_rows(dlogits_array, c.moe.routed_experts(), "dlogits");
      if (gt.dim(0) != dyt.dim(0))
        throw py::value_error("[python] dlogits has " + std::to_string(gt.dim(0)) + " rows, dy " +
                              std::to_string(dyt.dim(0)));
    }
    auto [dx, dxt] = new_rows(dyt.dim(0), D);
    {
      py::gil_scoped_release release;
      const ChosenThreads threads;
      std::lock_guard lock(mutex_);
      ffn_->context().logits_grad = gt.defined() ? &gt : nullptr;
      ffn_->backward(dxt, dyt);
      ffn_->context().logits_grad = nullptr;
    }
    written_in_place(dxt, dx, "backward");
    return dx;
  }

  FeedForward& ffn() { return *ffn_; }

  // What pickle and copy.deepcopy keep (__reduce__ below): the config, the seed and the
  // stochastic forwards drawn so far, copies of the parameter and gradient buffers, and the
  // settings. Not the last forward's activations (a copy has no backward to run), nor what MoE
  // gathers between optimizer steps for after_optimizer_step.
  py::dict state() {
    const auto lock = lock_with_gil();
    py::dict s;
    s["format"] = "ffnlab.FFN 1";
    s["config"] = from_json(config_to_json(ffn_->config()));
    s["seed"] = seed_;
    s["stochastic_forwards"] = stochastic_forwards_;
    py::list names;
    for (const auto& p : ffn_->parameters().list()) names.append(p.name);
    s["names"] = names;
    s["values"] = flat_copy(ffn_->parameters().values());
    s["grads"] = flat_copy(ffn_->parameters().grads());
    s["precision"] = std::string(enum_name(ffn_->precision()));
    s["aux_loss_scale"] = ffn_->aux_loss_scale();
    s["inference_weights"] = ffn_->inference_weights() == DType::bf16 ? "bf16" : "f32";
    return s;
  }
  static std::unique_ptr<Layer> from_state(const py::dict& state_arg) {
    const auto bad = [](const std::string& why) {
      return py::value_error("[python] not the state of an ffnlab.FFN this ffnlab reads: " + why);
    };
    const py::dict& s = state_arg;
    for (const char* key : {"format", "config", "seed", "stochastic_forwards", "names", "values",
                            "grads", "precision", "aux_loss_scale", "inference_weights"})
      if (!s.contains(key)) throw bad(std::string("no '") + key + "'");
    if (string_argument("FFN", "format", s["format"]) != "ffnlab.FFN 1")
      throw bad("format " + shown(s["format"]));
    const FFNConfig c = config_of(s["config"], py::kwargs());
    check_layer_memory(c);
    const std::uint64_t seed = seed_argument("FFN", s["seed"]);
    const ChosenThreads threads;
    auto layer = std::make_unique<Layer>(make_ffn(c, seed), seed);
    FeedForward& f = *layer->ffn_;
    py::list names;
    for (const auto& p : f.parameters().list()) names.append(p.name);
    if (!names.equal(s["names"].cast<py::object>()))
      throw bad("its parameters are not the config's");
    fill_from(f.parameters().values(), s["values"].cast<py::object>(), "values");
    fill_from(f.parameters().grads(), s["grads"].cast<py::object>(), "grads");
    f.set_precision(parse_enum<Precision>(string_argument("FFN", "precision", s["precision"])));
    f.set_aux_loss_scale(
        static_cast<float>(finite_argument("FFN", "aux_loss_scale", s["aux_loss_scale"])));
    layer->stochastic_forwards_ = static_cast<std::uint64_t>(
        int_argument("FFN", "stochastic_forwards", s["stochastic_forwards"], 0,
                     std::numeric_limits<std::int64_t>::max(), false));
    // The bf16 copy last: a snapshot of the weights just restored.
    if (string_argument("FFN", "inference_weights", s["inference_weights"]) == "bf16")
      f.set_inference_weights(DType::bf16);
    return layer;
  }

  std::int64_t forwards() {
    const auto lock = lock_with_gil();
    return static_cast<std::int64_t>(forwards_);
  }
  // f(layer) with the GIL released and the layer's lock held, as forward and backward run: a
  // call that reads or changes the layer's state waits for another thread's forward to end.
  template <class F>
  auto locked(F&& f) {
    py::gil_scoped_release release;
    const ChosenThreads threads;
    std::lock_guard lock(mutex_);
    return f(*ffn_);
  }

 private:
  // The layer's lock for a caller that holds the GIL, waited for with the GIL released: a thread
  // waiting for another thread's forward must not stop every Python thread meanwhile. (No one
  // waits for the lock holding the GIL, so a holder that takes the GIL back cannot deadlock.)
  std::unique_lock<std::mutex> lock_with_gil() {
    std::unique_lock lock(mutex_, std::defer_lock);
    if (!lock.try_lock()) {
      py::gil_scoped_release release;
      lock.lock();
    }
    return lock;
  }

  static py::array_t<float> flat_copy(const Tensor& t) {
    py::array_t<float> a(static_cast<py::ssize_t>(t.numel()));
    std::copy_n(t.f32(), t.numel(), a.mutable_data());
    return a;
  }
  static void fill_from(Tensor& t, const py::object& values, const char* what) {
    const py::array a = array_argument("FFN", what, values);
    if (!py::isinstance<py::array_t<float>>(a) || a.ndim() != 1 || a.shape(0) != t.numel())
      throw py::value_error(fmt::format(
          "[python] not the state of an ffnlab.FFN this ffnlab reads: '{}' must be {} float32 "
          "values",
          what, t.numel()));
    const py::array_t<float, py::array::c_style | py::array::forcecast> f = a;
    std::copy_n(f.data(), t.numel(), t.f32());
  }

  std::unique_ptr<FeedForward> ffn_;
  std::mutex mutex_;
  py::object saved_x_ = py::none();
  py::object saved_residual_ = py::none();
  Tensor residual_;  // the gate residual handed to the layer (a view of saved_residual_'s memory)
  std::uint64_t forwards_ = 0;  // forwards run (each takes the next number, under mutex_)
  std::uint64_t seed_ = 0, stochastic_forwards_ = 0;
};

// A new [rows, cols] array holding a copy of t ([0, 0] when t is empty).
py::array_t<float> rows_copy(const Tensor& t) {
  auto [a, at] = new_rows(t.defined() ? t.dim(0) : 0, t.defined() ? t.dim(1) : 0);
  if (t.defined()) std::copy(t.f32(), t.f32() + t.numel(), at.f32());
  return a;
}

// A copy of one of the layer's tensors, taken under its lock (a forward replaces them).
py::array_t<float> locked_copy(Layer& layer, const Tensor& (FeedForward::*tensor)() const) {
  const Tensor t = layer.locked([&](FeedForward& f) {
    const Tensor& x = (f.*tensor)();
    return x.defined() ? x.clone() : Tensor();
  });
  return rows_copy(t);
}

py::dict named_arrays(const py::object& self, bool grads) {
  Layer& layer = self.cast<Layer&>();
  py::dict out;
  for (const auto& p : layer.ffn().parameters().list())
    out[py::str(p.name)] = view_of(grads ? p.grad : p.value, self);
  return out;
}

py::dict stats_dict(const FFNStats& s) {
  py::dict d;
  d["tokens"] = s.tokens;
  d["zero_fraction"] = s.zero_fraction;
  if (s.num_experts == 0) return d;
  d["num_experts"] = s.num_experts;
  d["tokens_per_expert"] = s.tokens_per_expert;
  d["load_cv"] = s.load_cv;
  d["max_over_mean"] = s.max_over_mean;
  d["unused_fraction"] = s.unused_fraction;
  d["dropped"] = s.dropped;
  d["dropped_fraction"] = s.dropped_fraction;
  d["experts_per_token"] = s.experts_per_token;
  d["tokens_by_experts"] = s.tokens_by_experts;
  d["router_entropy"] = s.router_entropy;
  d["top1_prob"] = s.top1_prob;
  d["balance_loss"] = s.balance_loss;
  d["z_loss"] = s.z_loss;
  d["l1_coef"] = s.l1_coef;
  d["zero_computation_fraction"] = s.zero_computation_fraction;
  return d;
}

}  // namespace

PYBIND11_MODULE(_ffnlab, m) {
  m.doc() = "ffnlab's FFN and MoE layers on numpy arrays (docs/python.md)";
  m.attr("__version__") = FFNLAB_VERSION;

  // ffnlab's errors and the system's (a file-system error among them) take the kind the command
  // line gives them (Failure::of, its exit statuses), as Python's exceptions: refused input and
  // usage ValueError (a path that leads nowhere too), the system's the OSError of its errno but
  // memory (ENOMEM, std::bad_alloc among it) MemoryError, a stop KeyboardInterrupt; a JSON error
  // is refused input, ValueError. Anything else is pybind11's.
  py::register_exception_translator([](std::exception_ptr p) {
    const auto raise = [](const Failure& f) {
      if (f.kind == Failure::Kind::interrupted)
        PyErr_SetString(PyExc_KeyboardInterrupt, f.message.c_str());
      else if (f.kind == Failure::Kind::system && f.error_number == ENOMEM)
        PyErr_SetString(PyExc_MemoryError, f.message.c_str());
      else if (f.kind == Failure::Kind::system)
        raise_os_error(f.error_number, f.message);
      else
        PyErr_SetString(PyExc_ValueError, f.message.c_str());
    };
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      raise(Failure::of(e));
    } catch (const std::system_error& e) {  // std::filesystem::filesystem_error among them
      raise(Failure::of(e));
    } catch (const std::bad_alloc& e) {
      raise(Failure::of(e));
    } catch (const nlohmann::json::exception& e) {
      raise(Failure::of(e));
    }
  });

  py::class_<Layer>(m, "FFN", R"(An FFN or MoE layer (dense kinds and every MoE option).

FFN(config=None, seed=0, **keys): config is ffnlab's layer config as a dict (docs/config.md),
keys override or add keys of it, e.g. FFN(variant="swiglu", d_model=512, d_ff=1376, bias=False);
a dict merges into the config's (moe={"top_k": 4} beside a config's moe changes top_k alone).
Keys not given take the config's defaults (ffnlab.config(**keys) shows them all): a plain ReLU
FFN of d_model 512, d_ff 2048, with biases; variant="moe" has 8 experts, top-2, and aux_coef
0 (the study's and `ffnlab train`'s MoE set 0.01). Weights are initialised like
torch.nn.Linear from seed, an integer in [0, 2^64 - 1].)")
      .def(py::init(
               [](const py::object& config, const py::object& seed_arg, const py::kwargs& keys) {
                 const std::uint64_t seed = seed_argument("FFN", seed_arg);
                 const FFNConfig c = config_of(config, keys);
                 check_layer_memory(c);
                 const ChosenThreads threads;
                 return std::make_unique<Layer>(make_ffn(c, seed), seed);
               }),
           py::arg("config") = py::none(), py::arg("seed") = 0)
      .def("forward", &Layer::forward, py::arg("x"), py::arg("train") = false,
           py::arg("sequence") = 0, py::arg("gate_residual") = py::none(),
           py::arg("token_ids") = py::none(), py::arg("first") = false,
           py::arg("stochastic") = py::none(),
           R"(y [T, D] = FFN(x [T, D]); x: C-contiguous float32. y is a new array that owns its
memory. With train=True the layer keeps what backward needs, x included (by reference: do not
change x until backward). sequence: x holds sequences of this many tokens one after another,
which routings that look at the whole sequence (expert choice) route each on its own (0: x is
one sequence). gate_residual: for a layer with MoE++'s gating_residual, the previous MoE
layer's router logits [T, E] (its .logits), kept like x. token_ids: the tokens' ids [T]
(integers), which hash routing chooses by (a layer whose routing does not read them refuses
them). first: this is the model's first MoE layer, which
has no gate_residual (a layer with gating_residual refuses to run without one otherwise).
stochastic: route as in training (the router's jitter and noise, BASE layers' balanced
assignment); None: as train. Each stochastic forward draws new noise, the layer's n-th from its
seed and n: two layers built with the same seed draw the same sequence. train=True with stochastic=False keeps what backward needs but
routes as at inference, as a framework's evaluation mode with gradients does.)")
      .def("backward", &Layer::backward, py::arg("dy"), py::arg("dlogits") = py::none(),
           R"(dx [T, D] from dy [T, D] of the last training forward; parameter gradients
accumulate into grads() (zero_grad() clears them). dlogits: MoE with router logits, the
gradient of the loss wrt this layer's .logits [T, E]: from a layer that took them as its
gate_residual, or from a loss on them (Hugging Face's balancing loss).)")
      .def_property_readonly(
          "logits", [](Layer& l) { return locked_copy(l, &FeedForward::router_logits); },
          "MoE: the router logits of the last forward [T, E] (a copy), residual included: what "
          "the next layer with gating_residual takes as its gate_residual")
      .def_property_readonly(
          "has_router_logits", [](Layer& l) { return has_router_logits(l.ffn().config()); },
          "whether the layer is an MoE whose router is a Linear: it has .logits, and its backward "
          "takes their gradient (dlogits)")
      .def_property_readonly(
          "gate_residual_grad",
          [](Layer& l) { return locked_copy(l, &FeedForward::previous_logits_grad); },
          "gating_residual: the gradient of the loss wrt the gate_residual of the last backward "
          "[T, E] (a copy; [0, 0] when the forward had none): the previous layer's dlogits")
      .def(
          "parameters", [](const py::object& self) { return named_arrays(self, false); },
          "{name: float32 array}: views of the layer's weights (Hugging Face names); writing "
          "them changes the layer. They keep the layer alive.")
      .def(
          "grads", [](const py::object& self) { return named_arrays(self, true); },
          "{name: float32 array}: views of the parameter gradients, same names")
      .def(
          "trainable",
          [](Layer& l) {
            py::dict out;
            for (const auto& p : l.ffn().parameters().list()) out[py::str(p.name)] = p.trainable;
            return out;
          },
          "{name: bool}: False for state kept with the weights that no optimizer should move "
          "(the MoE's aux-loss-free balancing bias gate.e_score_correction_bias, ReLU routing's "
          "L1 coefficient gate.l1_coef)")
      .def(
          "zero_grad",
          [](Layer& l) { l.locked([](FeedForward& f) { f.parameters().zero_grad(); }); },
          "sets every gradient to zero (backward adds to them)")
      .def(
          "stats",
          [](Layer& l) { return stats_dict(l.locked([](FeedForward& f) { return f.stats(); })); },
          "statistics of the last forward: zero fraction; MoE: tokens per expert, load CV, ...")
      .def_property_readonly(
          "aux_loss",
          [](Layer& l) { return l.locked([](FeedForward& f) { return f.aux_loss(); }); },
          "MoE: the auxiliary loss of the last forward (an inference forward computes it too), "
          "with its coefficients (0 for dense layers)")
      .def(
          "set_aux_loss_scale",
          [](Layer& l, const py::object& scale) {
            const double s = finite_argument("set_aux_loss_scale", "scale", scale);
            if (!std::isfinite(static_cast<float>(s)))  // beyond float32's range
              bad_argument("set_aux_loss_scale", "scale", "a finite float32 number", scale);
            l.locked([&](FeedForward& f) { f.set_aux_loss_scale(static_cast<float>(s)); });
          },
          py::arg("scale"),
          "dLoss/d(aux_loss) that backward applies: 1 by default (the aux loss is part of the "
          "loss), 0 to leave it out")
      .def(
          "after_optimizer_step",
          [](Layer& l) { l.locked([](FeedForward& f) { f.after_optimizer_step(); }); },
          "MoE: once per optimizer step (the aux-loss-free balancing bias update; ReLU "
          "routing's L1 coefficient, from this layer's sparsity since the last step)")
      .def_property(
          "precision",
          [](Layer& l) {
            return std::string(enum_name(l.locked([](FeedForward& f) { return f.precision(); })));
          },
          [](Layer& l, const py::object& p) {
            const Precision precision =
                parse_enum<Precision>(string_argument("FFN", "precision", p));
            l.locked([&](FeedForward& f) { f.set_precision(precision); });
          },
          "'f32' or 'bf16' products")
      .def_property(
          "inference_weights",
          [](Layer& l) {
            const DType d = l.locked([](FeedForward& f) { return f.inference_weights(); });
            return d == DType::bf16 ? "bf16" : "f32";
          },
          [](Layer& l, const py::object& value) {
            const std::string d = string_argument("FFN", "inference_weights", value);
            if (d != "f32" && d != "bf16")
              throw py::value_error("[python] inference_weights must be 'f32' or 'bf16', got '" +
                                    d + "'");
            l.locked([&](FeedForward& f) {
              f.set_inference_weights(d == "bf16" ? DType::bf16 : DType::f32);
            });
          },
          "'f32' or 'bf16': the weights inference forwards read. bf16 is a copy of the weights "
          "made when set, a snapshot: after changing the weights (a view of parameters(), an "
          "optimizer step) set it again; a training forward drops it (back to 'f32')")
      .def_property_readonly(
          "config", [](Layer& l) { return from_json(config_to_json(l.ffn().config())); },
          "the layer's full config as a dict (every key, defaults filled in)")
      .def_property_readonly(
          "d_model", [](Layer& l) { return l.ffn().config().d_model; }, "the width of x and y")
      .def_property_readonly(
          "num_params", [](Layer& l) { return l.ffn().parameters().count(); },
          "the values in parameters(), the MoE's balancing state included")
      .def("__repr__",
           [](Layer& l) {
             const FFNConfig& c = l.ffn().config();
             return fmt::format("<ffnlab.FFN {} d_model={} d_ff={} params={}>", variant_name(c),
                                c.d_model, c.d_ff, l.ffn().parameters().count());
           })
      .def_property_readonly("forward_count", &Layer::forwards,
                             "forwards run so far (ffnlab.torch checks it in backward)")
      // pickle (any protocol) and copy.deepcopy: _ffn_from_state(the layer's state), the config,
      // seed, weights, gradients and settings (Layer::state).
      .def("__reduce__", [](Layer& l) {
        return py::make_tuple(py::module_::import("ffnlab").attr("_ffn_from_state"),
                              py::make_tuple(l.state()));
      });
  m.def(
      "_ffn_from_state", [](const py::dict& state) { return Layer::from_state(state); },
      py::arg("state"), "An FFN from FFN.__reduce__'s state (pickle and copy.deepcopy call it)");

  m.def(
      "from_hf",
      [](const py::object& config_arg, const py::object& weights_arg, const py::object& prefix_arg,
         const py::object& seed_arg) {
        const std::string config_path = path_argument("from_hf", "config_path", config_arg);
        const std::uint64_t seed = seed_argument("from_hf", seed_arg);
        std::optional<std::string> weights_path;
        if (!weights_arg.is_none())
          weights_path = path_argument("from_hf", "weights_path", weights_arg);
        const std::string prefix = string_argument("from_hf", "prefix", prefix_arg);
        std::unique_ptr<FeedForward> ffn;
        {
          py::gil_scoped_release release;
          const ChosenThreads threads;
          const FFNConfig c = read_ffn_config_file(config_path);
          check_layer_memory(c);
          ffn = make_ffn(c, seed);
          if (weights_path)
            load_parameters(ffn->parameters(), SafeTensors::load(*weights_path), prefix);
        }
        return std::make_unique<Layer>(std::move(ffn), seed);
      },
      py::arg("config_path"), py::arg("weights_path") = py::none(), py::arg("prefix") = "",
      py::arg("seed") = 0,
      "A layer from a Hugging Face config.json (or ffnlab's own), with weights from a "
      "safetensors file stored under prefix + the Hugging Face name; seed (an integer in "
      "[0, 2^64 - 1]) initialises what the file does not hold and draws the routing noise of "
      "stochastic forwards: give each layer of a model its own");
  m.def(
      "params",
      [](const py::object& config, const py::object& tokens_arg, const py::kwargs& keys) {
        const std::int64_t tokens =
            int_argument("params", "tokens", tokens_arg, 0, limits::kTokens, false);  // --tokens'
        nlohmann::ordered_json cost = to_json(ffn_cost(config_of(config, keys), tokens));
        cost["tokens"] = tokens;
        return from_json(cost);
      },
      py::arg("config") = py::none(), py::arg("tokens") = kCostTokens,
      "The cost accounting of a config, in the schema of `ffnlab params --json` (docs/costs.md): "
      "params, active_params, flops_per_token, saved_floats_per_token, memory_bytes, tokens");
  m.def(
      "zoo", [] { return from_json(study::zoo_table_json()); },
      "The FFN layers of real models, as `ffnlab zoo --json` prints them: per model its name, "
      "family, FFN layers, the layer's config (ffnlab.FFN(config) builds it; ffnlab.params(config) "
      "costs it), parameters and FLOPs as ffnlab computes them, and the source of every number");
  m.def(
      "activation_names", [] { return enum_names<Activation>(); },
      "The activations the library has, by the names configs use (for tables that map other "
      "libraries' activations onto them)");
  m.def(
      "variant_names", [] { return variant_names(); }, "The named FFN variants");
  m.def(
      "config",
      [](const py::object& config, const py::kwargs& keys) {
        return from_json(config_to_json(config_of(config, keys)));
      },
      py::arg("config") = py::none(), "The full config a dict and keys describe, every key set");
  m.def(
      "set_threads",
      [](const py::object& n_arg) {
        const std::int64_t n =
            int_argument("set_threads", "n", n_arg, std::numeric_limits<std::int64_t>::min(),
                         std::numeric_limits<std::int64_t>::max(), false);
        // At most the processors, as the command line's --threads: more only waits, and a huge
        // count makes the next parallel region fail to create its threads (the process ends).
        // (Or what OMP_NUM_THREADS already set, so that set_threads(get_threads()) restores.)
        const int most = std::max(omp_get_num_procs(), omp_get_max_threads());
        if (n < 1 || n > most)
          throw py::value_error(fmt::format(
              "[python] set_threads({}): threads must be in [1, {}] (the processors)", n, most));
        ChosenThreads::choose(static_cast<int>(n));
      },
      py::arg("n"),
      "OpenMP threads for the layers' work, in every Python thread that calls the library");
  m.def(
      "get_threads",
      [] {
        const ChosenThreads threads;  // as a call of the layers' work counts them
        return omp_get_max_threads();
      },
      "OpenMP threads the layers' work uses (set_threads, or OMP_NUM_THREADS, or the "
      "processors)");
  // The thresholds from which a path is taken: set_<name>(n) (0: never) and get_<name>().
  auto threshold = [&m](const char* name, const char* unit, void (*set)(std::int64_t),
                        std::int64_t (*get)(), const char* doc) {
    m.def(
        fmt::format("set_{}", name).c_str(),
        [name, unit, set](const py::object& n_arg) {
          const std::int64_t n = int_argument(fmt::format("set_{}", name), unit, n_arg,
                                              std::numeric_limits<std::int64_t>::min(),
                                              std::numeric_limits<std::int64_t>::max(), false);
          if (n < 0)
            throw py::value_error(
                fmt::format("[python] set_{}({}): {} must be 0 (never) or more", name, n, unit));
          set(n);
        },
        py::arg(unit), doc);
    m.def(fmt::format("get_{}", name).c_str(), get,
          fmt::format("The current threshold of set_{} ({}; 0: never)", name, unit).c_str());
  };
  threshold("weight_packing_min_rows", "rows", set_weight_packing_min_rows, weight_packing_min_rows,
            "Training products of this many rows or more read their weights packed in oneDNN's "
            "own layout (0: never)");
  threshold("conv_min_rows", "rows", set_matmul_conv_min_rows, matmul_conv_min_rows,
            "Forward and input-gradient products of this many rows or more run as oneDNN's 1x1 "
            "convolution instead of its matmul (0: never); by default from 512 rows where "
            "oneDNN's f32 products are not 512-bit, never elsewhere");
  threshold("huge_page_min_bytes", "bytes", set_huge_page_min_bytes, huge_page_min_bytes,
            "Tensors of this many bytes or more, allocated from now on, take a mapping of their "
            "own advised for transparent huge pages (0: never; Linux)");
  add_study(m);
}

}  // namespace ffnlab::python
