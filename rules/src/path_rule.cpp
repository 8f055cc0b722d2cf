#include "tasklet/rules/path_rule.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdio>
#include <iterator>

#include <boost/container/small_vector.hpp>

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

// Views of the input's segments while it is parsed; up to eight levels need no allocation.
using Segments = boost::container::small_vector<std::string_view, 8>;

// Splits and resolves iteratively, so that depth is bounded only by memory.
void parse(std::string_view input, Segments& segments) {
  if (input.empty()) reject(input, "a path must not be empty");
  if (input.find('\0') != std::string_view::npos) reject(input, "a path must not contain a NUL byte");
  if (input.front() != '/') reject(input, "a path must be absolute (start with '/')");
  std::size_t pos = 0;
  while (pos < input.size()) {
    if (input[pos] == '/') {
      ++pos;
      continue;
    }
    std::size_t end = input.find('/', pos);
    if (end == std::string_view::npos) end = input.size();
    const std::string_view segment = input.substr(pos, end - pos);
    pos = end;
    if (segment == ".") continue;
    if (segment == "..") {
      if (segments.empty()) reject(input, "\"..\" goes above the root");
      segments.pop_back();
      continue;
    }
    segments.emplace_back(segment);
  }
}

std::string join(const Segments& segments) {
  if (segments.empty()) return "/";
  std::size_t size = 0;
  for (const std::string_view segment : segments) size += segment.size() + 1;
  std::string path;
  path.reserve(size);
  for (const std::string_view segment : segments) {
    path += '/';
    path += segment;
  }
  return path;
}

}  // namespace

PathRule::PathRule(std::string_view path, Mode mode) : path_(normalize(path)), mode_(mode) {}

std::string PathRule::normalize(std::string_view path) {
  Segments segments;
  parse(path, segments);
  return join(segments);
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
