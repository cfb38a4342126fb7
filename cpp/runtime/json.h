// jaxbind's C runtime: the JSON a bundle's manifest is written in, read into a tree of
// values. Enough JSON for the manifest jaxbind/_bundle.py writes (objects, arrays, strings
// with escapes, integers, true, false, null); anything else is an error with its offset.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace jaxbind::runtime {

struct Json {
  enum Kind { kNull, kBool, kInt, kString, kArray, kObject } kind = kNull;
  bool boolean = false;
  int64_t integer = 0;
  std::string text;
  std::vector<Json> items;
  std::map<std::string, Json> fields;

  // A field of an object; throws naming `what` when it is missing or of another kind.
  const Json &at(const std::string &name, Kind want, const std::string &what) const {
    auto it = fields.find(name);
    if (kind != kObject || it == fields.end() || it->second.kind != want)
      throw std::invalid_argument(what + " lacks the field '" + name + "' of its kind");
    return it->second;
  }
  bool has(const std::string &name) const {
    return kind == kObject && fields.count(name) && fields.at(name).kind != kNull;
  }

  static Json parse(const std::string &s) {
    size_t at = 0;
    Json value = Parser{s, at}.value();
    Parser{s, at}.space();
    if (at != s.size()) throw std::invalid_argument("manifest.json: text after the JSON value");
    return value;
  }

 private:
  struct Parser {
    const std::string &s;
    size_t &at;

    [[noreturn]] void fail(const char *what) const {
      throw std::invalid_argument(std::string("manifest.json: ") + what + " at offset " +
                                  std::to_string(at));
    }
    void space() {
      while (at < s.size() && (s[at] == ' ' || s[at] == '\n' || s[at] == '\r' || s[at] == '\t'))
        ++at;
    }
    bool literal(const char *word) {
      size_t n = std::char_traits<char>::length(word);
      if (s.compare(at, n, word) != 0) return false;
      at += n;
      return true;
    }
    Json value() {
      space();
      if (at >= s.size()) fail("unexpected end");
      Json v;
      char c = s[at];
      if (c == '{') {
        v.kind = kObject;
        ++at;
        space();
        if (at < s.size() && s[at] == '}') return ++at, v;
        for (;;) {
          space();
          std::string key = string();
          space();
          if (at >= s.size() || s[at++] != ':') fail("expected ':'");
          v.fields[key] = value();
          space();
          if (at < s.size() && s[at] == ',') {
            ++at;
            continue;
          }
          if (at < s.size() && s[at] == '}') return ++at, v;
          fail("expected ',' or '}'");
        }
      }
      if (c == '[') {
        v.kind = kArray;
        ++at;
        space();
        if (at < s.size() && s[at] == ']') return ++at, v;
        for (;;) {
          v.items.push_back(value());
          space();
          if (at < s.size() && s[at] == ',') {
            ++at;
            continue;
          }
          if (at < s.size() && s[at] == ']') return ++at, v;
          fail("expected ',' or ']'");
        }
      }
      if (c == '"') {
        v.kind = kString;
        v.text = string();
        return v;
      }
      if (literal("true")) return v.kind = kBool, v.boolean = true, v;
      if (literal("false")) return v.kind = kBool, v;
      if (literal("null")) return v;
      if (c == '-' || (c >= '0' && c <= '9')) {
        size_t start = at++;
        while (at < s.size() && s[at] >= '0' && s[at] <= '9') ++at;
        if (at < s.size() && (s[at] == '.' || s[at] == 'e' || s[at] == 'E'))
          fail("a float (the manifest writes floats as hexadecimal strings)");
        errno = 0;
        v.kind = kInt;
        v.integer = std::strtoll(s.c_str() + start, nullptr, 10);
        if (errno != 0) fail("an integer out of range");
        return v;
      }
      fail("unexpected character");
    }
    std::string string() {
      if (at >= s.size() || s[at] != '"') fail("expected a string");
      ++at;
      std::string out;
      while (at < s.size() && s[at] != '"') {
        char c = s[at++];
        if (c != '\\') {
          out += c;
          continue;
        }
        if (at >= s.size()) fail("unfinished escape");
        char e = s[at++];
        switch (e) {
          case 'n':
            out += '\n';
            break;
          case 't':
            out += '\t';
            break;
          case 'r':
            out += '\r';
            break;
          case 'b':
            out += '\b';
            break;
          case 'f':
            out += '\f';
            break;
          case 'u': {
            if (at + 4 > s.size()) fail("unfinished \\u escape");
            unsigned code = static_cast<unsigned>(std::stoul(s.substr(at, 4), nullptr, 16));
            at += 4;
            if (code >= 0xD800 && code < 0xDC00 && s.compare(at, 2, "\\u") == 0) {
              unsigned low = static_cast<unsigned>(std::stoul(s.substr(at + 2, 4), nullptr, 16));
              at += 6;
              code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
            }
            utf8(code, out);
            break;
          }
          default:
            out += e;  // \" \\ \/
        }
      }
      if (at >= s.size()) fail("unfinished string");
      ++at;
      return out;
    }
    static void utf8(unsigned code, std::string &out) {
      if (code < 0x80) {
        out += static_cast<char>(code);
      } else if (code < 0x800) {
        out += static_cast<char>(0xC0 | (code >> 6));
        out += static_cast<char>(0x80 | (code & 0x3F));
      } else if (code < 0x10000) {
        out += static_cast<char>(0xE0 | (code >> 12));
        out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (code & 0x3F));
      } else {
        out += static_cast<char>(0xF0 | (code >> 18));
        out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (code & 0x3F));
      }
    }
  };
};

}  // namespace jaxbind::runtime
