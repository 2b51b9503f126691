// The optimizers' settings: SGD (with momentum, Nesterov's variant and
// weight decay) and Adam (with AdamW's decoupled weight decay and a choice
// of where epsilon goes). nn::Trainer applies them (trainer.hpp).
#pragma once

namespace deft::nn {

/// Stochastic gradient descent, optionally with momentum and weight decay.
/// With momentum mu each step is m = mu * m - lr * g, w += m (Gluon's form;
/// PyTorch's buf = mu * buf + g, w -= lr * buf is the same at a constant lr).
struct SGD {
  float learning_rate = 0.01f;  ///< step size, positive
  float momentum = 0.0f;        ///< 0: plain SGD
  float weight_decay = 0.0f;    ///< L2 penalty added to each gradient (times the weight)
  /// Nesterov momentum (Sutskever et al.): w += mu * m - lr * g after the
  /// update of m, as PyTorch's SGD(nesterov=True); needs a momentum.
  bool nesterov = false;
};
/// Where Adam adds epsilon to the denominator.
enum class AdamEpsilon {
  /// To sqrt(v) of the moments before bias correction, i.e. to
  /// sqrt(v_hat) * sqrt(1 - beta2^t) (Gluon, MXNet, the paper's efficient
  /// form; deft's default).
  before_correction,
  /// To sqrt(v_hat) of the bias-corrected moments (PyTorch, TensorFlow 2).
  after_correction,
};

/// Adam (Kingma & Ba), with bias correction. Each parameter's correction
/// counts its own updates (Gluon's rule): one a step left as it was
/// (ignore_stale_grad) is corrected as if that step had not happened.
/// The defaults are Gluon's; adamw() gives PyTorch's AdamW.
struct Adam {
  float learning_rate = 0.001f;  ///< step size, positive
  float beta1 = 0.9f;            ///< decay of the first-moment estimate
  float beta2 = 0.999f;          ///< decay of the second-moment estimate
  float epsilon = 1e-8f;         ///< added to the denominator (where: epsilon_at)
  float weight_decay = 0.0f;     ///< L2 penalty added to each gradient (times the weight), or with decoupled_weight_decay the weight's own decay
  /// AdamW (Loshchilov & Hutter): each step also shrinks the weight by
  /// learning_rate * weight_decay * w, instead of adding weight_decay * w to the gradient.
  bool decoupled_weight_decay = false;
  AdamEpsilon epsilon_at = AdamEpsilon::before_correction;  ///< where epsilon is added
};

/// AdamW as PyTorch's torch.optim.AdamW defines it: decoupled weight decay
/// (0.01 by default) and epsilon added after the bias correction.
inline Adam adamw(float learning_rate = 0.001f, float weight_decay = 0.01f) {
  return Adam{learning_rate, 0.9f, 0.999f, 1e-8f, weight_decay, true, AdamEpsilon::after_correction};
}

}  // namespace deft::nn
