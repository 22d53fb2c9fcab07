# `cmake --install BUILD --prefix P`: minitrain without its source tree.
#
#   P/bin/minitrain                  the command
#   P/bin/minitrain-supervise        scripts/supervise (relaunches a failed job, README "Exit statuses")
#   P/share/minitrain/plot.py        the plotting script, which `minitrain plot` finds beside the binary
#                                    (../share/minitrain, cli/plot.h)
#   P/share/minitrain/slurm.sbatch   the Slurm batch script of docs/launch.md
#   P/share/doc/minitrain/           README.md and docs/*.md
#
# The same rules for every build (with or without the CUDA backend or MPI). A prefix that cannot be
# written is refused, naming it, before anything is copied.
install(CODE [[
  set(mt_prefix "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}")
  set(mt_probe "${mt_prefix}/.minitrain-install-probe")
  execute_process(COMMAND "${CMAKE_COMMAND}" -E make_directory "${mt_prefix}" RESULT_VARIABLE mt_rc OUTPUT_QUIET ERROR_QUIET)
  if(mt_rc EQUAL 0)
    execute_process(COMMAND "${CMAKE_COMMAND}" -E touch "${mt_probe}" RESULT_VARIABLE mt_rc OUTPUT_QUIET ERROR_QUIET)
  endif()
  if(NOT mt_rc EQUAL 0)
    # The leading space keeps CMake from wrapping the line.
    message(FATAL_ERROR " minitrain: cannot install into '${mt_prefix}': it cannot be created or written (give a writable --prefix)")
  endif()
  file(REMOVE "${mt_probe}")
]])
# The installed binary keeps the run paths of libraries linked from outside the system directories
# (an MPI, CUDA or NCCL under /opt or /usr/local/cuda), as the build's binary has them.
set_target_properties(minitrain PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
install(TARGETS minitrain RUNTIME DESTINATION bin)
install(PROGRAMS ${CMAKE_SOURCE_DIR}/scripts/supervise DESTINATION bin RENAME minitrain-supervise)
install(PROGRAMS ${CMAKE_SOURCE_DIR}/scripts/plot.py ${CMAKE_SOURCE_DIR}/scripts/slurm.sbatch DESTINATION share/minitrain)
install(FILES ${CMAKE_SOURCE_DIR}/README.md DESTINATION share/doc/minitrain)
install(DIRECTORY ${CMAKE_SOURCE_DIR}/docs/ DESTINATION share/doc/minitrain/docs FILES_MATCHING PATTERN "*.md")
