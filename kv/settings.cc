#include "kv/settings.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "core/check.h"

namespace strata {

std::string_view SettingTypeName(SettingType t) {
  switch (t) {
    case SettingType::kInt:
      return "int";
    case SettingType::kReal:
      return "real";
    case SettingType::kBool:
      return "bool";
    case SettingType::kEnum:
      return "enum";
    case SettingType::kString:
      return "string";
  }
  return "?";
}

std::string RoundTripText(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

SettingDecl SettingDecl::Int(std::string name, int64_t def, std::string help) {
  SettingDecl d;
  d.name = std::move(name);
  d.type = SettingType::kInt;
  d.def = std::to_string(def);
  d.help = std::move(help);
  return d;
}

SettingDecl SettingDecl::Real(std::string name, double def, std::string help) {
  SettingDecl d;
  d.name = std::move(name);
  d.type = SettingType::kReal;
  d.def = RoundTripText(def);
  d.help = std::move(help);
  return d;
}

SettingDecl SettingDecl::Bool(std::string name, bool def, std::string help) {
  SettingDecl d;
  d.name = std::move(name);
  d.type = SettingType::kBool;
  d.def = def ? "on" : "off";
  d.help = std::move(help);
  return d;
}

SettingDecl SettingDecl::Enum(std::string name, std::string def, std::vector<std::string> choices,
                              std::string help) {
  SettingDecl d;
  d.name = std::move(name);
  d.type = SettingType::kEnum;
  d.def = std::move(def);
  d.choices = std::move(choices);
  d.help = std::move(help);
  return d;
}

SettingDecl SettingDecl::String(std::string name, std::string def, std::string forms,
                                std::string help) {
  SettingDecl d;
  d.name = std::move(name);
  d.type = SettingType::kString;
  d.def = std::move(def);
  d.forms = std::move(forms);
  d.help = std::move(help);
  return d;
}

SettingDecl& SettingDecl::Min(double v, bool open) {
  min = v;
  min_open = open;
  return *this;
}
SettingDecl& SettingDecl::Max(double v, bool open) {
  max = v;
  max_open = open;
  return *this;
}
SettingDecl& SettingDecl::Constraint(std::string text) {
  constraint = std::move(text);
  return *this;
}
SettingDecl& SettingDecl::Auto(std::string how) {
  auto_default = std::move(how);
  def.clear();
  return *this;
}
SettingDecl& SettingDecl::Shared() {
  shared = true;
  return *this;
}
SettingDecl& SettingDecl::Alias(std::string key) {
  aliases.push_back(std::move(key));
  return *this;
}
SettingDecl& SettingDecl::Default(std::string text) {
  def = std::move(text);
  auto_default.clear();
  return *this;
}

std::string SettingDecl::DefaultText() const {
  return auto_default.empty() ? def : auto_default;
}

namespace {

std::string Join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

std::string ChoicesText(const std::vector<std::string>& c) {
  if (c.size() <= 1) return c.empty() ? "" : c[0];
  return Join(std::vector<std::string>(c.begin(), c.end() - 1), ", ") + " or " + c.back();
}

}  // namespace

std::string SettingDecl::RangeText() const {
  std::string r;
  switch (type) {
    case SettingType::kBool:
      r = "on | off";
      break;
    case SettingType::kEnum:
      r = Join(choices, " | ");
      break;
    case SettingType::kString:
      r = forms.empty() ? "any" : forms;
      break;
    case SettingType::kInt:
    case SettingType::kReal:
      if (min && max) {
        r = std::string(min_open ? "(" : "[") + RoundTripText(*min) + ", " + RoundTripText(*max) +
            (max_open ? ")" : "]");
      } else if (min) {
        r = std::string(min_open ? "> " : ">= ") + RoundTripText(*min);
      } else if (max) {
        r = std::string(max_open ? "< " : "<= ") + RoundTripText(*max);
      } else {
        r = "any";
      }
      break;
  }
  if (!constraint.empty()) r += "; " + constraint;
  return r;
}

Status SettingDecl::Check(const std::string& value) const {
  const std::string what = "--" + name + " = '" + value + "'";
  double v = 0;
  switch (type) {
    case SettingType::kBool:
      if (value == "on" || value == "true" || value == "1" || value == "off" ||
          value == "false" || value == "0") {
        return OkStatus();
      }
      return InvalidArgument(what + " must be on or off");
    case SettingType::kEnum:
      if (std::find(choices.begin(), choices.end(), value) != choices.end()) return OkStatus();
      return InvalidArgument(what + " must be " + ChoicesText(choices));
    case SettingType::kString:
      if (value.empty()) return InvalidArgument("--" + name + " needs a value (" + forms + ")");
      return OkStatus();
    case SettingType::kInt: {
      char* end = nullptr;
      errno = 0;
      const long long x = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || errno == ERANGE) {
        return InvalidArgument(what + " is not an integer");
      }
      v = static_cast<double>(x);
      break;
    }
    case SettingType::kReal: {
      char* end = nullptr;
      errno = 0;
      v = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v)) {
        return InvalidArgument(what + " is not a finite number");
      }
      break;
    }
  }
  const bool lo_ok = !min || (min_open ? v > *min : v >= *min);
  const bool hi_ok = !max || (max_open ? v < *max : v <= *max);
  if (lo_ok && hi_ok) return OkStatus();
  SettingDecl bare = *this;
  bare.constraint.clear();
  return InvalidArgument("--" + name + " = " + value + " must be " +
                         (min && max ? "in " : "") + bare.RangeText());
}

const SettingDecl* PolicySettings::Find(std::string_view key) const {
  for (const SettingDecl& d : settings) {
    if (d.name == key) return &d;
    for (const std::string& a : d.aliases) {
      if (a == key) return &d;
    }
  }
  return nullptr;
}

std::string PolicySettings::NamesText() const {
  if (settings.empty()) return "no settings";
  std::vector<std::string> names;
  for (const SettingDecl& d : settings) names.push_back(d.name);
  return Join(names, ", ");
}

const SettingDecl& ResolvedSettings::Decl(const std::string& name) const {
  STRATA_CHECK_MSG(decl_ != nullptr, "ResolvedSettings used before ResolveSettings");
  const SettingDecl* d = decl_->Find(name);
  STRATA_CHECK_MSG(d != nullptr && d->name == name, "%s does not declare the setting '%s'",
                   decl_->policy.c_str(), name.c_str());
  return *d;
}

const std::string& ResolvedSettings::text(const std::string& name) const {
  const SettingDecl& d = Decl(name);
  auto it = values_.find(name);
  STRATA_CHECK_MSG(it != values_.end(), "%s: the auto default of '%s' is resolved by the policy",
                   decl_->policy.c_str(), d.name.c_str());
  return it->second;
}

int64_t ResolvedSettings::Int(const std::string& name) const {
  STRATA_CHECK(Decl(name).type == SettingType::kInt);
  return std::strtoll(text(name).c_str(), nullptr, 10);
}

double ResolvedSettings::Real(const std::string& name) const {
  STRATA_CHECK(Decl(name).type == SettingType::kReal);
  return std::strtod(text(name).c_str(), nullptr);
}

bool ResolvedSettings::Bool(const std::string& name) const {
  STRATA_CHECK(Decl(name).type == SettingType::kBool);
  const std::string& v = text(name);
  return v == "on" || v == "true" || v == "1";
}

int EditDistance(std::string_view a, std::string_view b) {
  std::vector<int> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

StatusOr<ResolvedSettings> ResolveSettings(
    const PolicySettings& decl, const std::map<std::string, std::string>& settings,
    const std::function<std::vector<std::string>(const std::string&)>& declared_by) {
  ResolvedSettings r;
  r.decl_ = std::make_shared<const PolicySettings>(decl);
  std::map<std::string, std::string> via;  // declared name -> the key it was given as
  for (const auto& [key, value] : settings) {
    const SettingDecl* d = decl.Find(key);
    if (d == nullptr) {
      // The closest declared name (or alias), if it is close enough to be a typo: at most 2 edits
      // and fewer than half the key's letters.
      std::string best;
      int best_d = 1 << 30;
      for (const SettingDecl& s : decl.settings) {
        std::vector<std::string> names = s.aliases;
        names.insert(names.begin(), s.name);
        for (const std::string& n : names) {
          const int e = EditDistance(key, n);
          if (e < best_d) best_d = e, best = n;
        }
      }
      const int limit = std::min<int>(2, static_cast<int>(key.size()) / 2);
      if (!best.empty() && best_d <= limit) {
        return InvalidArgument("unknown setting '" + key + "' for " + decl.policy +
                               "; did you mean '" + best + "'?");
      }
      const std::vector<std::string> owners = declared_by ? declared_by(key)
                                                          : std::vector<std::string>{};
      const std::string takes = decl.settings.empty()
                                    ? decl.policy + " takes no settings"
                                    : decl.policy + " takes: " + decl.NamesText();
      if (!owners.empty()) {
        return InvalidArgument(decl.policy + " does not take '" + key + "' (a setting of " +
                               Join(owners, ", ") + "); " + takes);
      }
      return InvalidArgument("unknown setting '" + key + "' for " + decl.policy + "; " + takes);
    }
    if (auto it = via.find(d->name); it != via.end()) {
      return InvalidArgument(decl.policy + ": '" + key + "' and '" + it->second +
                             "' are the same setting (" + d->name + "); give it once");
    }
    via[d->name] = key;
    RETURN_IF_ERROR(d->Check(value));
    r.values_[d->name] = value;
    r.given_.insert(d->name);
  }
  for (const SettingDecl& d : decl.settings) {
    if (!r.values_.count(d.name) && d.auto_default.empty()) r.values_[d.name] = d.def;
  }
  return r;
}

}  // namespace strata
