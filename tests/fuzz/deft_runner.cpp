// The deft side of a program, in lockstep with the reference interpreter.
#include "deft_runner.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <vector>

#include <deft/deft.hpp>

#include "fused.hpp"
#include "reference.hpp"

namespace fz {

std::string float_literal(float v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.9g", double(v));
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s + "f";
}

namespace {

/// A difference between deft and the reference (or an unexpected deft error).
struct Mismatch {
  std::string what;
};

std::string index_str(std::int64_t i, const Dims& shape) {
  Dims idx(shape.size());
  for (long d = long(shape.size()) - 1; d >= 0; --d) {
    idx[d] = shape[d] ? i % shape[d] : 0;
    i = shape[d] ? i / shape[d] : 0;
  }
  return dims_str(idx, "[", "]");
}

class Runner {
 public:
  Runner(const Program& p, Counters& c, std::ostream* code) : prog_(p), cnt_(c), code_(code) {}

  void run() {
    for (std::size_t i = 0; i < prog_.stmts.size(); ++i) {
      const Stmt& s = prog_.stmts[i];
      ref_.exec(s);  // throws ref::Invalid for a program that is not valid
      ++cnt_.statements;
      try {
        exec(s);
      } catch (Mismatch& m) {
        m.what = "statement " + std::to_string(i) + ": " + m.what;
        throw;
      }
    }
    line("// end of program: every live handle is checked");
    for (int k = 0; k < kSlots; ++k) {
      if (bool(t_[k]) != ref_.slots[k].live())
        throw Mismatch{"t" + std::to_string(k) + " is " + (t_[k] ? "live" : "empty") + " in deft but not in the reference"};
      if (t_[k]) {
        line("std::cout << t" + std::to_string(k) + " << '\\n';");
        check(k, "end of program");
      }
    }
    for (auto& t : t_) t = deft::Tensor<float>();
    line("deft::wait_all();");
    deft::wait_all();
  }

 private:
  const Program& prog_;
  Counters& cnt_;
  std::ostream* code_;
  ref::Interpreter ref_;
  deft::Tensor<float> t_[kSlots];
  int ntmp_ = 0;

  void line(const std::string& s) {
    if (code_) *code_ << "  " << s << '\n';
  }
  static std::string slot(int k) { return "t" + std::to_string(k); }

  // --- operands ---------------------------------------------------------------------

  /// Fills `a` for operand node n: a number where allowed, a slot's own handle,
  /// or a new deft tensor (a leaf, or the subtree evaluated as its own task).
  void fill(Arg& a, const Node& n, bool scalar_ok, std::string& nm) {
    if (n.kind == Node::scalar && scalar_ok) {
      a.scalar = true;
      a.s = n.value;
      nm = float_literal(n.value);
    } else if (n.kind == Node::slot) {
      a.t = &t_[n.index];
      nm = slot(n.index);
    } else {
      a.own = tensor_of(n, nm);
      a.t = &a.own;
    }
  }

  deft::Tensor<float> tensor_of(const Node& n, std::string& nm) {
    nm = "x" + std::to_string(++ntmp_);
    switch (n.kind) {
      case Node::slot: nm = slot(n.index); return t_[n.index];
      case Node::scalar:
        line("auto " + nm + " = deft::full<float>({}, " + float_literal(n.value) + ");");
        return deft::full<float>(deft::Shape{}, n.value);
      case Node::fresh: {
        if (n.filled) {
          line("auto " + nm + " = deft::full<float>(" + dims_str(n.shape) + ", " + float_literal(n.value) + ");");
          return deft::full<float>(deft::Shape(n.shape), n.value);
        }
        auto v = fresh_values(n);
        if (code_) {
          std::string vals;
          for (std::size_t i = 0; i < v.size() && i < 4096; ++i) vals += (i ? ", " : "") + float_literal(v[i]);
          if (v.size() > 4096) vals += " /* ... " + std::to_string(v.size()) + " values in all */";
          line("deft::Tensor<float> " + nm + "(std::vector<float>{" + vals + "}, deft::Shape" + dims_str(n.shape) + ");");
        }
        return deft::Tensor<float>(std::move(v), deft::Shape(n.shape));
      }
      default: {
        deft::Tensor<float> r;
        write_tree(Sink::bind, r, nm, n, true);
        return r;
      }
    }
  }

  /// `target = tree` or `target.assign(tree)` with the top of the tree fused.
  void write_tree(Sink sink, deft::Tensor<float>& target, const std::string& target_code, const Node& n, bool declare) {
    if (sink == Sink::bind && n.kind == Node::slot) {  // handle copy: both share storage
      line(target_code + " = " + slot(n.index) + ";");
      target = t_[n.index];
      return;
    }
    const Site site = sink == Sink::bind ? Site::bind : Site::assign;
    const Plan p = plan_for(n, site);
    std::vector<Arg> args(p.args.size());  // sized once: Arg::t may point into it
    std::vector<std::string> names(p.args.size());
    for (std::size_t i = 0; i < args.size(); ++i) fill(args[i], *p.args[i], scalar_ok(p, i, site), names[i]);
    const std::string e = plan_code(p, names);
    if (sink == Sink::bind) line((declare ? "deft::Tensor<float> " : "") + target_code + " = " + e + ";");
    else line(target_code + ".assign(" + e + ");");
    fused_write(sink, target, p, args.data());
  }

  /// A tensor operand for dot/transpose (never a plain number).
  deft::Tensor<float> operand(const Node& n, std::string& nm) {
    if (n.kind == Node::slot) {
      nm = slot(n.index);
      return t_[n.index];
    }
    return tensor_of(n, nm);
  }

  // --- statements --------------------------------------------------------------------

  void exec(const Stmt& s) {
    const std::string d = slot(s.dst);
    auto& dst = t_[s.dst];
    switch (s.kind) {
      case Stmt::bind: write_tree(Sink::bind, dst, d, s.tree, false); return;
      case Stmt::compound: {
        Plan p = plan_for(s.tree, Site::compound);
        if (p.pat != Pat::leaf && !compound_fuses(s.op)) p = Plan{Pat::leaf, {}, {}, {&s.tree}};
        std::vector<Arg> args(p.args.size());
        std::vector<std::string> names(p.args.size());
        for (std::size_t i = 0; i < args.size(); ++i) fill(args[i], *p.args[i], scalar_ok(p, i, Site::compound), names[i]);
        line(d + " " + name(s.op) + "= " + plan_code(p, names) + ";");
        fused_compound(dst, s.op, p, args.data());
        return;
      }
      case Stmt::share:
        line(d + " = " + slot(s.src) + ";");
        dst = t_[s.src];
        return;
      case Stmt::rows_view:
        line(d + " = " + slot(s.src) + ".rows(" + std::to_string(s.lo) + ", " + std::to_string(s.hi) + ");");
        dst = t_[s.src].rows(s.lo, s.hi);
        return;
      case Stmt::reshape_view:
        line(d + " = " + slot(s.src) + ".reshape(" + dims_str(s.dims) + ");");
        dst = t_[s.src].reshape(std::vector<std::int64_t>(s.dims));
        return;
      case Stmt::assign: write_tree(Sink::assign, dst, d, s.tree, false); return;
      case Stmt::assign_rows: {
        const std::string v = d + ".rows(" + std::to_string(s.lo) + ", " + std::to_string(s.hi) + ")";
        deft::Tensor<float> view = dst.rows(s.lo, s.hi);
        write_tree(Sink::assign, view, v, s.tree, false);
        return;
      }
      case Stmt::clone:
        line(d + " = " + slot(s.src) + ".clone();");
        dst = t_[s.src].clone();
        return;
      case Stmt::drop:
        line(d + " = deft::Tensor<float>();");
        dst = deft::Tensor<float>();
        return;
      case Stmt::reduce: {
        Plan p = plan_for(s.tree, Site::reduce);
        if (!reduce_fuses(s.red, s.all, p)) p = Plan{Pat::leaf, {}, {}, {&s.tree}};
        std::vector<Arg> args(p.args.size());
        std::vector<std::string> names(p.args.size());
        for (std::size_t i = 0; i < args.size(); ++i) fill(args[i], *p.args[i], false, names[i]);
        std::string call = std::string(name(s.red)) + "(" + plan_code(p, names);
        if (!s.all) call += ", " + std::to_string(s.axis) + (s.keepdims ? ", true" : ", false");
        call += ")";
        if (s.red == Red::argmax) call = "deft::cast<float>(" + call + ")";
        line(d + " = " + call + ";");
        dst = fused_reduce(s.red, s.all, s.axis, s.keepdims, p, args.data());
        return;
      }
      case Stmt::dot: {
        std::string na, nb;
        auto a = operand(s.tree, na);
        auto b = operand(s.tree2, nb);
        line(d + " = deft::dot(" + na + ", " + nb + ");");
        dst = deft::dot(a, b);
        return;
      }
      case Stmt::transpose: {
        std::string na;
        auto a = operand(s.tree, na);
        line(d + " = deft::transpose(" + na + ");");
        dst = deft::transpose(a);
        return;
      }
      case Stmt::wait:
        line(d + ".wait_to_read();");
        dst.wait_to_read();
        line("std::cout << " + d + " << '\\n';");
        check(s.dst, "after wait_to_read()");
        return;
      case Stmt::to_vector:
        line("std::cout << " + d + " << '\\n';  // to_vector()");
        check(s.dst, "to_vector()");
        return;
      case Stmt::item: {
        line("std::cout << " + d + ".item() << '\\n';");
        const float v = dst.item();
        compare({v}, ref_.read(s.dst), "item()");
        return;
      }
      case Stmt::wait_all:
        line("deft::wait_all();");
        deft::wait_all();
        line("std::cout << " + d + " << '\\n';");
        check(s.dst, "after wait_all()");
        return;
      case Stmt::invalid: {
        const Stmt body = ref::Interpreter::invalid_body(s);
        line("try {  // deft must refuse this with std::invalid_argument");
        try {
          exec(body);
        } catch (const std::invalid_argument&) {
          line("} catch (const std::invalid_argument&) {}");
          ++cnt_.invalid_checked;
          return;
        }
        line("}");
        throw Mismatch{"deft accepted a statement that is not valid"};
      }
    }
  }

  // --- checks ------------------------------------------------------------------------

  void check(int k, const char* what) {
    const ref::Value r = ref_.read(k);
    const Dims got(t_[k].shape().begin(), t_[k].shape().end());
    if (got != r.shape)
      throw Mismatch{slot(k) + " " + what + ": deft shape " + dims_str(got, "(", ")") + ", reference shape " +
                     dims_str(r.shape, "(", ")")};
    compare(t_[k].to_vector(), r, std::string(what) + " of " + slot(k));
  }

  void compare(const std::vector<float>& got, const ref::Value& r, const std::string& what) {
    ++cnt_.syncs;
    if (got.size() != r.data.size())
      throw Mismatch{what + ": deft has " + std::to_string(got.size()) + " values, the reference " + std::to_string(r.data.size())};
    for (std::size_t i = 0; i < got.size(); ++i) {
      const ref::Val& x = r.data[i];
      if (x.unk) {
        ++cnt_.skipped;
        continue;
      }
      ++cnt_.compared;
      const double g = got[i];
      bool ok;
      if (std::isnan(x.v)) ok = std::isnan(g);
      else if (std::isinf(x.v) || x.e == 0) ok = g == x.v;
      else ok = std::abs(g - x.v) <= ref::kTolerance * x.e;
      if (!ok) {
        std::ostringstream os;
        os.precision(9);
        os << what << ", element " << i << " " << index_str(std::int64_t(i), r.shape) << ": deft " << g << ", reference "
           << x.v << " (bound " << x.e << ", tolerance " << ref::kTolerance << " x bound)";
        throw Mismatch{os.str()};
      }
    }
  }
};

}  // namespace

Result run_program(const Program& p, Counters& c, std::ostream* code) {
  ++c.programs;
  // These calls drain the engine: never concurrent with recording.
  deft::engine::set_mode(deft::engine::Mode::deferred);
  if (deft::engine::num_workers() != p.workers) deft::engine::set_num_workers(p.workers);
  if (p.synchronous) deft::engine::set_mode(deft::engine::Mode::synchronous);
  if (code) {
    *code << "// deft_fuzz reproducer (seed " << p.seed << ")\n#include <cmath>\n#include <cstdint>\n#include <iostream>\n"
          << "#include <vector>\n#include <deft/deft.hpp>\n\nint main() {\n"
          << "  const float inf = INFINITY, nan = NAN;\n  (void)inf; (void)nan;\n"
          << "  deft::engine::set_num_workers(" << p.workers << ");\n"
          << "  deft::engine::set_mode(deft::engine::Mode::" << (p.synchronous ? "synchronous" : "deferred") << ");\n"
          << "  deft::Tensor<float> t0, t1, t2, t3, t4, t5;\n";
  }
  Result res;
  {
    Runner r(p, c, code);
    try {
      r.run();
    } catch (const ref::Invalid& e) {
      res = {Result::invalid, e.what()};
      ++c.invalid_programs;
    } catch (const Mismatch& m) {
      res = {Result::mismatch, m.what};
    } catch (const std::exception& e) {
      res = {Result::mismatch, std::string("deft threw: ") + e.what()};
    }
  }
  if (code) {
    if (res.status == Result::mismatch) *code << "  // ^ MISMATCH: " << res.message << '\n';
    *code << "}\n";
  }
  try {
    deft::wait_all();  // a failure left in the engine must not leak into the next program
  } catch (const std::exception& e) {
    if (res.status == Result::ok) res = {Result::mismatch, std::string("deferred failure: ") + e.what()};
  }
  return res;
}

}  // namespace fz
