// The settings schema of a cache policy: each policy declares its settings once (name, type,
// default, range, help, shared or not); the registry, the policies' parsers, the CLI flags,
// `strata policies` and the docs tables all read that one declaration.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace strata {

enum class SettingType { kInt, kReal, kBool, kEnum, kString };
// "int", "real", "bool", "enum", "string".
std::string_view SettingTypeName(SettingType t);

// One declared setting. Built with the factories and chained modifiers, e.g.
//   SettingDecl::Int("block", 4096, "rows per closed block").Min(64).Constraint("a multiple of 64")
struct SettingDecl {
  std::string name;
  SettingType type = SettingType::kString;
  // The default as text, exactly as a user would write it (the parsers read this text, so a
  // default value is the value of the same text given on the command line). Empty when the
  // default is model-dependent (`auto_default`).
  std::string def;
  // Non-empty: there is no fixed default; what happens instead, in a few words, shown as the
  // default ("auto: the largest power of two dividing 64 and the head dim": chosen at Bind;
  // "unset: the ratio sets the pages": the setting is simply off).
  std::string auto_default;
  // int/real bounds (absent: unbounded); open bounds exclude the value itself.
  std::optional<double> min, max;
  bool min_open = false, max_open = false;
  std::vector<std::string> choices;  // enum: the allowed values
  std::string forms;                 // string: the accepted forms, e.g. "ram | file:DIR"
  // A rule the policy checks against its other settings (e.g. "< block/2"); shown with the range.
  std::string constraint;
  std::string help;  // one line
  // A shared setting means the same in every policy that declares it and has a `--NAME`
  // shorthand flag on every command that names a policy (ratio, bits, sinks, ...).
  bool shared = false;
  std::vector<std::string> aliases;  // other accepted keys (e.g. recall-rank for rank)

  static SettingDecl Int(std::string name, int64_t def, std::string help);
  static SettingDecl Real(std::string name, double def, std::string help);
  static SettingDecl Bool(std::string name, bool def, std::string help);
  static SettingDecl Enum(std::string name, std::string def, std::vector<std::string> choices,
                          std::string help);
  static SettingDecl String(std::string name, std::string def, std::string forms,
                            std::string help);

  SettingDecl& Min(double v, bool open = false);
  SettingDecl& Max(double v, bool open = false);
  SettingDecl& Constraint(std::string text);
  SettingDecl& Auto(std::string how);  // no fixed default (sets auto_default, clears `def`)
  SettingDecl& Shared();
  SettingDecl& Alias(std::string key);
  SettingDecl& Default(std::string text);  // replaces the default text (a variant's own default)

  // "4096", "on", or the auto_default text.
  std::string DefaultText() const;
  // ">= 64; a multiple of 64", "[0, 1]", "(0, 1]", "on | off", "prefix | decode", "any".
  std::string RangeText() const;
  // Type and range check of one value; InvalidArgument naming "--NAME" and the value.
  Status Check(const std::string& value) const;
};

// Shortest decimal text that reads back as exactly `v` ("0.5", "32", "0.125").
std::string RoundTripText(double v);

// The declaration of one policy's settings.
struct PolicySettings {
  std::string policy;
  std::vector<SettingDecl> settings;
  // The setting its `NAME@X` shorthand fills ("ratio", "bits"); empty: none.
  std::string budget;

  // By name or alias; null when the policy does not declare the key.
  const SettingDecl* Find(std::string_view key) const;
  bool Takes(std::string_view key) const { return Find(key) != nullptr; }
  // "ratio, block, kappa, ..." or "no settings".
  std::string NamesText() const;
};

// A policy's settings after validation: every declared setting, the given ones as given (aliases
// mapped to the declared name), the others at their declared default. Reading a key the policy
// does not declare, or an auto default that was not given, is a programming error (checked).
class ResolvedSettings {
 public:
  ResolvedSettings() = default;
  bool given(const std::string& name) const { return given_.count(name) != 0; }
  const std::string& text(const std::string& name) const;
  int64_t Int(const std::string& name) const;
  double Real(const std::string& name) const;
  bool Bool(const std::string& name) const;

 private:
  friend StatusOr<ResolvedSettings> ResolveSettings(
      const PolicySettings&, const std::map<std::string, std::string>&,
      const std::function<std::vector<std::string>(const std::string&)>&);
  const SettingDecl& Decl(const std::string& name) const;
  std::shared_ptr<const PolicySettings> decl_;  // a copy: callers may pass a temporary
  std::map<std::string, std::string> values_;
  std::set<std::string> given_;
};

// Validates `settings` against the declaration and fills the defaults. Errors:
//   unknown key, close to a declared one: "unknown setting 'recal' for vestige; did you mean
//     'recall'?"
//   a key the policy does not take: "streaming does not take 'bits' (a setting of geodesia,
//     cquest); streaming takes: ratio, sinks" (`declared_by(key)` names the policies that do
//     declare it; may be empty)
//   a key given under two names (a setting and its alias);
//   a value of the wrong type or out of range (SettingDecl::Check).
StatusOr<ResolvedSettings> ResolveSettings(
    const PolicySettings& decl, const std::map<std::string, std::string>& settings,
    const std::function<std::vector<std::string>(const std::string&)>& declared_by = nullptr);

// Levenshtein distance (insertions, deletions, substitutions).
int EditDistance(std::string_view a, std::string_view b);

}  // namespace strata
