using System.Diagnostics;
using System.Reflection.Emit;
using System.Runtime;
using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Http;
using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Tests.Hosting;

/// <summary>
/// First-use work on a cold start is no warning (issue 38): with Adaptive the default, every user would otherwise see
/// warning 22 for the JIT's work on the loop. The JIT runs in every test of the process, so this runs alone
/// (<see cref="QuietProcess"/>), where the process's JIT falls quiet.
/// </summary>
[Collection(QuietProcess.Name)]
public sealed class AdaptiveColdStartTests(ITestOutputHelper output)
{
    private const string Handoffs = "kestrel.transport.linux.loop.handoffs";
    private const int Methods = 1000;
    private const int BlocksPerMethod = 40;
    private const int ComputeAttempts = 10;

    /// <summary>
    /// A first request whose handler spends well over 10 ms of its thread's CPU in the JIT (many fresh methods compiled on
    /// the loop, as a cold start compiles them), is handed off like any computation, but logged at Debug, not as warning
    /// 22: users who never chose Adaptive would otherwise see warnings from every cold start. A handler that computes as
    /// long (without the JIT) still gets its warning, once the process's JIT is quiet.
    /// </summary>
    [Theory]
    [MemberData(nameof(AdaptiveTesting.Kinds), MemberType = typeof(AdaptiveTesting))]
    public async Task JIT_compilation_that_holds_the_loop_is_no_warning_but_computation_is(TransportKind kind)
    {
        var log = new TransportLogLines();
        await using var host = await AdaptiveTesting.StartAsync(
            kind,
            output,
            async context =>
            {
                if (context.Request.Path == "/jit")
                {
                    await context.Response.WriteAsync($"{Enumerable.Range(0, Methods).Sum(i => CompileAndRun(i, BlocksPerMethod))}");
                    return;
                }

                if (context.Request.Path == "/compute")
                {
                    AdaptiveTesting.ComputeFor(TimeSpan.FromMilliseconds(40));
                }

                await context.Response.WriteAsync("ok");
            },
            settings: s => s.Builder = b =>
            {
                b.Logging.AddProvider(log);
                b.Logging.AddFilter<TransportLogLines>(TransportLog.Category, LogLevel.Debug);
            });

        using var meter = new TaggedMeasurements(host);
        var connections = await AdaptiveTesting.WarmedAsync(host, 1 + ComputeAttempts);
        try
        {
            Assert.NotEmpty(await AdaptiveTesting.GetAsync(connections[0], "/jit", TestTimeouts.Default));
            meter.Collect();
            output.WriteLine($"after the JIT: {meter.Describe(Handoffs)}");
            Assert.True(meter.Sum(Handoffs, "kestrel.transport.linux.handoff.reason=computing") >= 1, "the JIT's work was not handed off, so this case shows nothing");
            Assert.Empty(log.With(22, LogLevel.Warning));
            Assert.NotEmpty(log.With(22, LogLevel.Debug));

            // While anything in the process compiles (tiered compilation promotes the request path in the background), a
            // computation counts as first-use work too: the computation is compiled here first, the JIT left to fall
            // quiet, and a request that computes is tried on one fresh connection after another until one is warned of.
            AdaptiveTesting.ComputeFor(TimeSpan.FromMilliseconds(100));
            int attempts = 0;
            while (log.With(22, LogLevel.Warning).Count == 0 && attempts < ComputeAttempts)
            {
                await JitQuietAsync();
                Assert.Equal("ok", await AdaptiveTesting.GetAsync(connections[++attempts], "/compute", TestTimeouts.Default));
            }

            output.WriteLine($"{attempts} computing request(s) until a warning: {string.Join(" | ", log.With(22))}");
            Assert.NotEmpty(log.With(22, LogLevel.Warning));
        }
        finally
        {
            connections.ForEach(c => c.Dispose());
        }

        await host.StopAsync();
    }

    /// <summary>Waits until the process has compiled nothing for 200 ms (tiered compilation settles in the background).</summary>
    private static async Task JitQuietAsync()
    {
        var waited = Stopwatch.StartNew();
        var last = JitInfo.GetCompilationTime(currentThread: false);
        var quiet = Stopwatch.StartNew();
        while (quiet.ElapsedMilliseconds < 200 && waited.Elapsed < TestTimeouts.Default)
        {
            await Task.Delay(20);
            var now = JitInfo.GetCompilationTime(currentThread: false);
            if (now != last)
            {
                last = now;
                quiet.Restart();
            }
        }
    }

    /// <summary>
    /// Compiles and runs a new method of <paramref name="blocks"/> compare-and-branch blocks, a new one each call, so the
    /// JIT always runs. The handler's 1000 methods of 40 blocks took about 140 ms of JIT time in 167 ms on this machine
    /// (JitInfo), accruing evenly: the JIT counts a method's time when it is done, so many small methods, as a cold start
    /// compiles, not one large one.
    /// </summary>
    private static int CompileAndRun(int seed, int blocks)
    {
        var method = new DynamicMethod("first_use", typeof(int), [typeof(int)], typeof(AdaptiveColdStartTests).Module);
        var il = method.GetILGenerator();
        var accumulator = il.DeclareLocal(typeof(int));
        il.Emit(OpCodes.Ldarg_0);
        il.Emit(OpCodes.Ldc_I4, seed);
        il.Emit(OpCodes.Add);
        il.Emit(OpCodes.Stloc, accumulator);
        for (int i = 0; i < blocks; i++)
        {
            var skip = il.DefineLabel();
            il.Emit(OpCodes.Ldloc, accumulator);
            il.Emit(OpCodes.Ldc_I4, i);
            il.Emit(OpCodes.Bgt, skip);
            il.Emit(OpCodes.Ldloc, accumulator);
            il.Emit(OpCodes.Ldc_I4, (i * 7) + 1);
            il.Emit(OpCodes.Xor);
            il.Emit(OpCodes.Stloc, accumulator);
            il.MarkLabel(skip);
        }

        il.Emit(OpCodes.Ldloc, accumulator);
        il.Emit(OpCodes.Ret);
        return method.CreateDelegate<Func<int, int>>()(5);
    }
}
