#!/usr/bin/env python3
"""Writes big.cc, the large C++ file of bench/README.md "Large target" (400 template
instantiations over <map>, <regex>, <sstream>; ~17 s for clang++-22 -O2 on the project VM)."""
import sys

lines = ['#include <vector>', '#include <map>', '#include <string>', '#include <algorithm>',
         '#include <unordered_map>', '#include <functional>', '#include <sstream>', '#include <regex>']
for i in range(400):
    lines.append(f'template<int N> struct S{i} {{ std::map<std::string,std::vector<int>> m; int f(int x) {{ '
                 f'std::vector<int> v(x); std::sort(v.begin(), v.end()); std::stringstream ss; ss << x << N; '
                 f'return (int)m[ss.str()].size() + (int)v.size(); }} }};')
    lines.append(f'int g{i}(int x) {{ S{i}<{i}> s; std::regex r("a+b*"); return s.f(x) + (int)std::regex_match("aab", r); }}')
open(sys.argv[1] if len(sys.argv) > 1 else 'big.cc', 'w').write('\n'.join(lines) + '\n')
