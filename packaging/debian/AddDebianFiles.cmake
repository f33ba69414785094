# CPack pre-build script: after each component is staged and before its .deb is built, adds what
# Debian requires of every binary package: /usr/share/doc/<package>/copyright and
# changelog.Debian.gz, and /usr/share/lintian/overrides/<package> where a tag is explained.
foreach(pair IN LISTS CPACK_KVAGENT_PACKAGES)
  string(REPLACE ":" ";" pair "${pair}")
  list(GET pair 0 component)
  list(GET pair 1 package)
  set(root "${CPACK_TEMPORARY_DIRECTORY}/${component}${CPACK_PACKAGING_INSTALL_PREFIX}")
  if(NOT IS_DIRECTORY "${CPACK_TEMPORARY_DIRECTORY}/${component}")
    continue()
  endif()
  # file(COPY), not file(INSTALL): CPack's DESTDIR must not apply to these absolute paths.
  file(COPY "${CPACK_KVAGENT_DEBIAN_DIR}/copyright" "${CPACK_KVAGENT_CHANGELOG}"
       DESTINATION "${root}/share/doc/${package}"
       FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
  if(EXISTS "${CPACK_KVAGENT_DEBIAN_DIR}/${package}.lintian-overrides")
    file(MAKE_DIRECTORY "${root}/share/lintian/overrides")
    file(COPY_FILE "${CPACK_KVAGENT_DEBIAN_DIR}/${package}.lintian-overrides"
         "${root}/share/lintian/overrides/${package}")
  endif()
endforeach()
