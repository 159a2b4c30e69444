"""Deliberately broken loaders: the reference adapter with exactly one defect each.

They prove that the suite catches bad loaders: run against one of them, the suite fails, and the
rules its report marks failed are the ones the defect breaks (`breaks`, plus `also_fails` where a
test pins two rules at once). Together they break every MUST rule the suite reaches through the
adapter. Run one by hand with:

    python -m pytest tests/unit --loader=fakes.broken:AdoptsTensorParallelShards
"""

from __future__ import annotations

from fakes.broken.admission import (
    AdmitsOneFlagAtATime,
    AllowsFsdpWithDirectDit,
    CaseInsensitiveSelection,
    CaseSensitiveComponentValues,
    ChecksOnlyTheDitAgainstThePlatform,
    ChecksOnlyTheMainTransformer,
    CoercesConstructionValues,
    IgnoresCheckpointQuantization,
    IgnoresUnsupportedRequests,
    LenientDitFlag,
    MaybeMeansTrue,
    NoMemoryMargin,
    ParsesPastDoubleDash,
    PutsPositionalsFirst,
    ReadsBeforeRefusingQuantizedDirect,
    StreamsVaesByDefault,
)
from fakes.broken.base import BrokenAdapter
from fakes.broken.checkpoints import (
    IgnoresShardIndex,
    ReadsDotfilesAsShards,
    ReadsOneOfSeveralUnindexedFiles,
    RefusesUnindexedFoldersAndDotfiles,
    SafetensorsLibraryErrors,
    UnpicklesLegacyCheckpoints,
)
from fakes.broken.dit import (
    AdoptsSharedBytesTwice,
    BuffersBecomeParameters,
    CopiesWithoutWeightLoader,
    FallsBackToUnquantized,
    IgnoresFsdp,
    KeepsCheckpointDtype,
    LeavesAdoptedTrainable,
    LeavesDitTraining,
    LosesAdoptedAttributes,
    MapsCheckpointShared,
    MapsFilesInDirectModeOnCpu,
    OffloadsBeforeProcessing,
    PreconvertsForWeightLoader,
    PreReadsDirectCheckpoint,
    ReadsBeforeChecking,
    UpcastsOnOffload,
)
from fakes.broken.fairness import TrustsStateDict
from fakes.broken.pipeline import (
    BuildsDefaultsOnlyOnMeta,
    FillsMetaBuildsByAssignment,
    KeepsComponentsOfAFailedLoad,
    LeavesOutWhatItCannotBuild,
    LoadsOnlyTheKindsItKnowsByName,
    PreflightsEachComponentAlone,
    StagesEveryComponentAtOnce,
)
from fakes.broken.plans import (
    DefaultPlanOnCpu,
    DefersResidentComponents,
    DisablesOffloadForOnlineFp8,
    IgnoresCpuLoadDeclaration,
    LoadsOffloadedQuantizedOnCpu,
    MutablePlans,
    NeverLoadsOnCpu,
    ProcessesSerializedCheckpoints,
    UnvalidatedPlans,
)
from fakes.broken.precision import (
    AcceptsUndeclaredPrecisions,
    BuildsInTheClassDtype,
    CastsFp32ModulesToo,
    ConvertsTheWholeStateFirst,
    CopiesWhenAPrecisionIsGiven,
)
from fakes.broken.staging import RefillsStagingBeforeCopiesEnd, StagesTheWholeCheckpoint
from fakes.broken.strength import (
    BuildsTheConfigUnbounded,
    DefersOnlyTheMainTransformer,
    FollowsIndexesOutOfTheirFolder,
    LoadsSafePicklesAsAFallback,
    MapsOneFileCheckpointsShared,
    PreflightsTheFirstShardOnly,
    RunsNoRebuildHooks,
)
from fakes.broken.text_encoders import (
    HandsUnknownClassesToAutoModel,
    InitialisesTheEncoderBuild,
    LoadsEncodersAtTheDitPrecision,
    ReadsNamesAsWritten,
    UntiesTheEmbeddings,
)
from fakes.broken.vae import (
    BuildsBuffersOnMeta,
    CpuStreamKeepsFileViews,
    DropsUnknownTensors,
    FallsBackForQuantizedVae,
    FreezesStreamedParameters,
    IgnoresChannelsLast,
    KeepsFileDtype,
    LeavesMissingSlotsOnMeta,
    LetsMetaBuffersThrough,
    ReadsWholeVaeCheckpoint,
    RefusesConstructedBuffersAtEnd,
    RefusesMetaBuffersLate,
    ToleratesMissingSlots,
)
from fakes.broken.vae_slots import (
    AllowsTiedState,
    ChecksOnlyStateDict,
    IgnoresKeysThatAreNotSlots,
    IgnoresUserHooks,
    LetsLazyStateThrough,
)
from fakes.broken.zero_copy import (
    AcceptsOverridingSubclasses,
    AdoptsOffCpuTensors,
    AdoptsParameterSubclasses,
    AdoptsTensorParallelShards,
    AdoptsTransposedViews,
    CopiesInDirectMode,
    CopiesPlainParameters,
    IgnoresQuantMethod,
    IgnoresShardedWeightFlag,
    TrustsUnboundLoaders,
)

__all__ = ["BROKEN", "CORRECT"]

BROKEN: tuple[type[BrokenAdapter], ...] = (
    # plans and placement
    MutablePlans,
    DefersResidentComponents,
    UnvalidatedPlans,
    DefaultPlanOnCpu,
    NeverLoadsOnCpu,
    LoadsOffloadedQuantizedOnCpu,
    IgnoresCpuLoadDeclaration,
    ProcessesSerializedCheckpoints,
    DisablesOffloadForOnlineFp8,
    # the zero-copy predicate
    AdoptsOffCpuTensors,
    CopiesPlainParameters,
    TrustsUnboundLoaders,
    AcceptsOverridingSubclasses,
    IgnoresQuantMethod,
    AdoptsTensorParallelShards,
    AdoptsParameterSubclasses,
    IgnoresShardedWeightFlag,
    AdoptsTransposedViews,
    CopiesInDirectMode,
    # DiT loading steps
    LosesAdoptedAttributes,
    CopiesWithoutWeightLoader,
    KeepsCheckpointDtype,
    AdoptsSharedBytesTwice,
    MapsCheckpointShared,
    MapsOneFileCheckpointsShared,
    ReadsBeforeChecking,
    PreReadsDirectCheckpoint,
    MapsFilesInDirectModeOnCpu,
    RefillsStagingBeforeCopiesEnd,
    StagesTheWholeCheckpoint,
    OffloadsBeforeProcessing,
    DefersOnlyTheMainTransformer,
    IgnoresFsdp,
    FallsBackToUnquantized,
    UpcastsOnOffload,
    BuffersBecomeParameters,
    LeavesDitTraining,
    LeavesAdoptedTrainable,
    # precision
    BuildsInTheClassDtype,
    CastsFp32ModulesToo,
    AcceptsUndeclaredPrecisions,
    CopiesWhenAPrecisionIsGiven,
    ConvertsTheWholeStateFirst,
    # direct VAE loading
    ReadsWholeVaeCheckpoint,
    ChecksOnlyStateDict,
    TrustsStateDict,
    IgnoresUserHooks,
    DropsUnknownTensors,
    IgnoresKeysThatAreNotSlots,
    LetsLazyStateThrough,
    AllowsTiedState,
    KeepsFileDtype,
    ToleratesMissingSlots,
    LeavesMissingSlotsOnMeta,
    LetsMetaBuffersThrough,
    RefusesMetaBuffersLate,
    RunsNoRebuildHooks,
    RefusesConstructedBuffersAtEnd,
    BuildsBuffersOnMeta,
    FreezesStreamedParameters,
    IgnoresChannelsLast,
    FallsBackForQuantizedVae,
    CpuStreamKeepsFileViews,
    # text and image encoders
    InitialisesTheEncoderBuild,
    UntiesTheEmbeddings,
    LoadsEncodersAtTheDitPrecision,
    HandsUnknownClassesToAutoModel,
    ReadsNamesAsWritten,
    # arguments and admission
    LenientDitFlag,
    CaseSensitiveComponentValues,
    MaybeMeansTrue,
    PutsPositionalsFirst,
    CoercesConstructionValues,
    CaseInsensitiveSelection,
    AdmitsOneFlagAtATime,
    ChecksOnlyTheDitAgainstThePlatform,
    IgnoresUnsupportedRequests,
    StreamsVaesByDefault,
    AllowsFsdpWithDirectDit,
    IgnoresCheckpointQuantization,
    ReadsBeforeRefusingQuantizedDirect,
    ChecksOnlyTheMainTransformer,
    NoMemoryMargin,
    PreflightsTheFirstShardOnly,
    # whole pipelines
    LeavesOutWhatItCannotBuild,
    LoadsOnlyTheKindsItKnowsByName,
    PreflightsEachComponentAlone,
    KeepsComponentsOfAFailedLoad,
    StagesEveryComponentAtOnce,
    FillsMetaBuildsByAssignment,
    BuildsDefaultsOnlyOnMeta,
    # checkpoints
    UnpicklesLegacyCheckpoints,
    IgnoresShardIndex,
    SafetensorsLibraryErrors,
    ReadsOneOfSeveralUnindexedFiles,
    ReadsDotfilesAsShards,
    FollowsIndexesOutOfTheirFolder,
    LoadsSafePicklesAsAFallback,
    BuildsTheConfigUnbounded,
)
"""Every broken loader, in catalogue order."""

CORRECT: tuple[type[BrokenAdapter], ...] = (
    PreconvertsForWeightLoader,
    ParsesPastDoubleDash,
    RefusesUnindexedFoldersAndDotfiles,
)
"""Variants of the reference that real loaders do differently and that SPEC leaves free: the
suite must fail them on nothing (each names the rules whose tests it runs, `exercises`)."""
