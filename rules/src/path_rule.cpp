#include "tasklet/rules/path_rule.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdio>
#include <iterator>

#include "rules/key_relations.hpp"
#include "tasklet/error.hpp"

namespace tasklet {
namespace {

// The input as it appears in error messages: quoted, control bytes escaped (a NUL would cut the
// message short), UTF-8 kept, and very long input shortened.
std::string quote(std::string_view input) {
  constexpr std::size_t shown = 200;
  std::string text = "\"";
  for (const char c : input.substr(0, shown)) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      text += '\\';
      text += c;
    } else if (byte < 0x20 || byte == 0x7f) {
      std::array<char, 8> escaped{};
      std::snprintf(escaped.data(), escaped.size(), "\\x%02x", static_cast<unsigned>(byte));
      text += escaped.data();
    } else {
      text += c;
    }
  }
  text += '"';
  if (input.size() > shown) text += "... (" + std::to_string(input.size()) + " bytes)";
  return text;
}

[[noreturn]] void reject(std::string_view input, const char* reason) {
  throw InvalidPath("invalid path " + quote(input) + ": " + reason);
}

}  // namespace

PathRule::PathRule(std::string_view path, Mode mode) : path_(normalize(path)), mode_(mode) {}

// One pass over the input, writing the normal form as it goes: a ".." drops what the output has
// after its last '/'. Iterative, so that depth is bounded only by memory. The output is never longer
// than the input (every kept segment brings its own '/'), so a string of the input's size holds it.
std::string PathRule::normalize(std::string_view path) {
  if (path.empty()) reject(path, "a path must not be empty");
  if (path.find('\0') != std::string_view::npos) reject(path, "a path must not contain a NUL byte");
  if (path.front() != '/') reject(path, "a path must be absolute (start with '/')");
  // Written through a pointer and a length: appending to the string would store and reload its
  // size for every piece.
  std::string normal(path.size(), '/');
  char* const out = normal.data();
  std::size_t length = 0;
  const std::size_t size = path.size();
  std::size_t pos = 0;
  while (pos < size) {
    if (path[pos] == '/') {
      ++pos;
      continue;
    }
    std::size_t end = pos + 1;
    while (end < size && path[end] != '/') ++end;
    const std::string_view segment = path.substr(pos, end - pos);
    pos = end;
    if (segment == ".") continue;
    if (segment == "..") {
      if (length == 0) reject(path, "\"..\" goes above the root");
      length = std::string_view(out, length).rfind('/');
      continue;
    }
    out[length++] = '/';
    std::copy(segment.begin(), segment.end(), out + length);
    length += segment.size();
  }
  normal.resize(std::max<std::size_t>(length, 1));  // nothing left is the root, "/"
  // A shorter normal form (the input had ".", ".." or repeated '/') gives back the room it left:
  // the rule keeps its path, and one of up to 15 bytes then fits inside the string.
  if (normal.size() < path.size()) normal.shrink_to_fit();
  return normal;
}

bool PathRule::is_ancestor_or_equal(std::string_view ancestor, std::string_view descendant) noexcept {
  if (ancestor.size() <= 1) return true;  // the root
  if (ancestor.size() > descendant.size()) return false;
  // A whole segment of `descendant` must end where `ancestor` does.
  if (ancestor.size() < descendant.size() && descendant[ancestor.size()] != '/') return false;
  // Backwards: paths that share a long prefix usually differ near their ends.
  return std::equal(ancestor.rbegin(), ancestor.rend(),
                    descendant.rend() - static_cast<std::ptrdiff_t>(ancestor.size()));
}

bool PathRule::keys_conflict(const RuleKey& a, const RuleKey& b) noexcept {
  if (a.shared && b.shared) return false;
  return a.path.size() <= b.path.size() ? is_ancestor_or_equal(a.path, b.path)
                                        : is_ancestor_or_equal(b.path, a.path);
}

bool PathRule::key_contains(const RuleKey& outer, const RuleKey& inner) noexcept {
  return (!outer.shared || inner.shared) && is_ancestor_or_equal(outer.path, inner.path);
}

bool PathRule::contains(const SchedulingRule& other) const {
  if (&other == this) return true;
  const RuleKey theirs = other.key();
  const RuleKey mine = key();
  switch (theirs.kind) {
    case RuleKey::Kind::path:
      return key_contains(mine, theirs);
    case RuleKey::Kind::multi:
      return !theirs.children.empty() &&
             std::all_of(theirs.children.begin(), theirs.children.end(), [&](const Rule& child) {
               return rules::detail::atom_contains(*this, mine, *child, child->key());
             });
    default:
      return false;
  }
}

bool PathRule::is_conflicting(const SchedulingRule& other) const {
  if (&other == this) return !is_shared();
  const RuleKey theirs = other.key();
  const RuleKey mine = key();
  switch (theirs.kind) {
    case RuleKey::Kind::path:
      return keys_conflict(mine, theirs);
    case RuleKey::Kind::multi:
      return std::any_of(theirs.children.begin(), theirs.children.end(), [&](const Rule& child) {
        return rules::detail::atoms_conflict(*this, mine, *child, child->key());
      });
    default:
      return false;
  }
}

std::string PathRule::to_string() const { return (is_shared() ? "read_path(" : "path(") + path_ + ")"; }

RuleKey PathRule::key() const noexcept { return {RuleKey::Kind::path, is_shared(), path_, {}, {}}; }

}  // namespace tasklet
