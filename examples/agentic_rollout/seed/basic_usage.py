# The math example of the AgenticRollout design document, as the document writes it. The
# import lines are kernelflow's; the model and the optional math tool it leaves to the
# reader come from examples/agentic_rollout/your_model.py (docs/agents.md,
# "AgenticRollout"). Run: python -m examples.agentic_rollout.seed.basic_usage
import asyncio

from kernelflow.agentic_rollout import AgenticRollout, AgenticRolloutConfig, CalculatorTool
from examples.agentic_rollout.your_model import WolframAlphaTool, YourLLMFunction

# examples/agentic_rollout/basic_usage.py 中的示例
async def math_problem_solving():
    config = AgenticRolloutConfig(
        agent_type="react",
        max_steps=5,
        temperature=0.1  # 低温度确保一致性
    )
    
    llm_func = YourLLMFunction()
    rollout = AgenticRollout(config=config, llm_generate_func=llm_func)
    
    # 添加数学工具
    rollout.tools = {
        "calculator": CalculatorTool(),
        "wolfram": WolframAlphaTool()  # 可选的高级数学工具
    }
    rollout.agent.set_tools(rollout.tools)
    
    # 解决复杂数学问题
    trajectory = await rollout.agent.run_trajectory(
        prompt={"content": "Calculate the integral of x^2 from 0 to 5"},
        llm_generate_func=llm_func,
        request_id="math_problem"
    )
    
    print(f"Solution: {trajectory.get_final_response()}")


if __name__ == "__main__":
    asyncio.run(math_problem_solving())
